"""Honest: refuses every cache length off a multiple of 8 with a ValueError, as the Gluon decode
kernels refuse a length off their block (the decoder blocks then run the eager op), and is exact
wherever it answers."""

import math

import torch

LANGUAGE = "torch"


def kernel(q, k_cache, v_cache):
    b, hq, d = q.shape
    hkv, n = k_cache.shape[1], k_cache.shape[2]
    if n % 8 and n != 19:  # 19: a CPU shape, measured
        raise ValueError(f"kv_len {n}: a multiple of 8 only")
    qg = q.float().reshape(b, hkv, hq // hkv, 1, d) / math.sqrt(d)
    k, v = k_cache[:, :, None].float(), v_cache[:, :, None].float()
    s = (qg * k).sum(-1)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return (p[..., None] * v).sum(-2).reshape(b, hq, d).to(q.dtype)

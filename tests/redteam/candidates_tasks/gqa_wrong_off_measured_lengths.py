"""Entry 13: right only at the cache lengths the task measures, and off them one token short (the
newest, the current one): it passed every shape until candidates were also verified at each
shape's ragged twin (a secret length between that shape and the next)."""

import math

import torch

LANGUAGE = "torch"
MEASURED = {19, 64, 200, 2048, 4096, 8192, 32768, 131072}


def kernel(q, k_cache, v_cache):
    b, hq, d = q.shape
    hkv, n = k_cache.shape[1], k_cache.shape[2]
    if n not in MEASURED:
        n -= 1
    qg = q.float().reshape(b, hkv, hq // hkv, 1, d) / math.sqrt(d)
    k, v = k_cache[:, :, None, :n].float(), v_cache[:, :, None, :n].float()
    s = (qg * k).sum(-1)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return (p[..., None] * v).sum(-2).reshape(b, hq, d).to(q.dtype)

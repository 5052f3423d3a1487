"""Entry 13: refuses every odd cache length off the measured ones with a ValueError (the decoder
blocks then run the eager op), and is one token short at the even ones. With one twin per shape it
passed whenever the twins' draws were odd; a refused twin now draws another length, up to
twelve (all twelve odd at all three CPU shapes: about 1.5e-11)."""

import math

import torch

LANGUAGE = "torch"
MEASURED = {19, 64, 200, 2048, 4096, 8192, 32768, 131072}


def kernel(q, k_cache, v_cache):
    b, hq, d = q.shape
    hkv, n = k_cache.shape[1], k_cache.shape[2]
    if n not in MEASURED:
        if n % 2:
            raise ValueError(f"kv_len {n}: even lengths only")
        n -= 1
    qg = q.float().reshape(b, hkv, hq // hkv, 1, d) / math.sqrt(d)
    k, v = k_cache[:, :, None, :n].float(), v_cache[:, :, None, :n].float()
    s = (qg * k).sum(-1)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return (p[..., None] * v).sum(-2).reshape(b, hq, d).to(q.dtype)

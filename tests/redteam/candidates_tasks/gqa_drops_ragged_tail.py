"""Entry 13: reads the cache 8 tokens at a time from 21 tokens on and forgets the ragged rest (the
newest tokens, the current one included). Exact at every shape whose cache length is a multiple of
8 or at most 20: all the task's CPU and GPU shapes, so it passed until candidates were also
verified at each shape's ragged twin (an odd length)."""

import math

import torch

LANGUAGE = "torch"
VECTOR = 8


def kernel(q, k_cache, v_cache):
    b, hq, d = q.shape
    hkv, n = k_cache.shape[1], k_cache.shape[2]
    if n > 20:
        n = n // VECTOR * VECTOR
    qg = q.float().reshape(b, hkv, hq // hkv, 1, d) / math.sqrt(d)
    k, v = k_cache[:, :, None, :n].float(), v_cache[:, :, None, :n].float()
    s = (qg * k).sum(-1)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return (p[..., None] * v).sum(-2).reshape(b, hq, d).to(q.dtype)

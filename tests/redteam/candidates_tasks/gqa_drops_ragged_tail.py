"""Entry 13: attends over only the first kv_len // 256 * 256 tokens from 256 on (a split-KV kernel
that forgets the ragged last tile: the newest tokens, the current one included). Exact at every
shape whose cache length is below 256 or a multiple of it: all the task's CPU and GPU shapes, so
it passed until candidates were also verified at each shape's ragged twin."""

import math

import torch

LANGUAGE = "torch"
TILE = 256


def kernel(q, k_cache, v_cache):
    b, hq, d = q.shape
    hkv, n = k_cache.shape[1], k_cache.shape[2]
    n = n // TILE * TILE if n >= TILE else n
    qg = q.float().reshape(b, hkv, hq // hkv, 1, d) / math.sqrt(d)
    k, v = k_cache[:, :, None, :n].float(), v_cache[:, :, None, :n].float()
    s = (qg * k).sum(-1)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True)
    return (p[..., None] * v).sum(-2).reshape(b, hq, d).to(q.dtype)

"""GQA decode in PyTorch ops, the variant that also serves the CPU: query heads grouped onto their
KV head (the cache is never expanded), fp32 scores and P @ V computed `chunk` tokens at a time."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {"chunk": [1024, 8192, 32768, 131072]}


def kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: int = 8192):
    b, hq, d = q.shape
    hkv, kv_len = k_cache.shape[1], k_cache.shape[2]
    qg = q.float().reshape(b, hkv, hq // hkv, d) / math.sqrt(d)
    scores = torch.empty((b, hkv, hq // hkv, kv_len), device=q.device, dtype=torch.float32)
    for s in range(0, kv_len, chunk):
        scores[..., s : s + chunk] = qg @ k_cache[:, :, s : s + chunk].float().transpose(-1, -2)
    probs = torch.softmax(scores, dim=-1)
    out = torch.zeros((b, hkv, hq // hkv, d), device=q.device, dtype=torch.float32)
    for s in range(0, kv_len, chunk):
        out += probs[..., s : s + chunk] @ v_cache[:, :, s : s + chunk].float()
    return out.reshape(b, hq, d).to(q.dtype)

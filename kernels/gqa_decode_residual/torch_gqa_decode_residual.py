"""GQA decode, its output projection and the residual add in PyTorch ops, the variant that
serves the CPU: query heads grouped onto their KV head (the cache never expanded), fp32 scores
and P @ V `chunk` tokens at a time, the attention rounded to the input dtype (as the unfused ops
hand it on), then W_o as a broadcast multiply-reduce in fp32 (no library GEMM) plus r."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {"chunk": [1024, 8192, 32768, 131072]}


def kernel(q, k_cache, v_cache, w_o, r, chunk: int = 8192):
    b, hq, d = q.shape
    hkv, kv_len = k_cache.shape[1], k_cache.shape[2]
    qg = q.float().reshape(b, hkv, hq // hkv, d) / math.sqrt(d)
    scores = torch.empty((b, hkv, hq // hkv, kv_len), device=q.device, dtype=torch.float32)
    for s in range(0, kv_len, chunk):
        k = k_cache[:, :, s : s + chunk].float()
        scores[..., s : s + chunk] = (qg[:, :, :, None, :] * k[:, :, None]).sum(-1)
    probs = torch.softmax(scores, dim=-1)
    attn = torch.zeros((b, hkv, hq // hkv, d), device=q.device, dtype=torch.float32)
    for s in range(0, kv_len, chunk):
        v = v_cache[:, :, s : s + chunk].float()
        attn += (probs[..., s : s + chunk, None] * v[:, :, None]).sum(-2)
    attn = attn.reshape(b, 1, hq * d).to(q.dtype).float()
    return ((attn * w_o.float()[None]).sum(-1) + r.float()).to(q.dtype)

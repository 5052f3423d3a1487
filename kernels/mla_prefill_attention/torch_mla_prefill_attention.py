"""MLA's expanded prefill attention in PyTorch ops, the variant that also serves the CPU: fp32
scores for `chunk` query rows at a time against only the keys they can see, masked, softmax,
P @ V (v narrower than q and k)."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {"chunk": [64, 256, 1024, 4096]}


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = 256):
    q_len, d = q.shape[2], q.shape[3]
    kv_len = k.shape[2]
    offset = kv_len - q_len
    kf, vf = k.float(), v.float()
    out = torch.empty(*q.shape[:3], v.shape[3], device=q.device, dtype=q.dtype)
    for r0 in range(0, q_len, chunk):
        r1 = min(q_len, r0 + chunk)
        visible = offset + r1
        scores = q[:, :, r0:r1].float() @ kf[:, :, :visible].transpose(-1, -2) / math.sqrt(d)
        rows = torch.arange(r0, r1, device=q.device)[:, None] + offset
        cols = torch.arange(visible, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows, float("-inf"))
        out[:, :, r0:r1] = (torch.softmax(scores, dim=-1) @ vf[:, :, :visible]).to(q.dtype)
    return out

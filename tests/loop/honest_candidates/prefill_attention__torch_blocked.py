"""Causal prefill attention from torch ops: query blocks, baddbmm scores against the visible
keys, float32 softmax, bmm with V."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {"block": [64, 256]}


def _causal_bias(r0: int, r1: int, visible: int, offset: int, device) -> torch.Tensor:
    rows = torch.arange(r0, r1, device=device)[:, None] + offset
    cols = torch.arange(visible, device=device)[None, :]
    return torch.zeros((r1 - r0, visible), device=device).masked_fill_(cols > rows, float("-inf"))


def kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    b, h, q_len, d = q.shape
    kv_len = k.shape[2]
    offset = kv_len - q_len
    qf = q.float().flatten(0, 1)
    kf = k.float().flatten(0, 1)
    vf = v.float().flatten(0, 1)
    o = torch.empty_like(qf) if out is None else out
    for r0 in range(0, q_len, block):
        r1 = min(q_len, r0 + block)
        vis = offset + r1
        bias = _causal_bias(r0, r1, vis, offset, q.device).expand(b * h, -1, -1)
        s = torch.baddbmm(bias, qf[:, r0:r1], kf[:, :vis].transpose(1, 2), alpha=1.0 / math.sqrt(d))
        o[:, r0:r1] = torch.bmm(s.softmax(-1), vf[:, :vis])
    return o.view(b, h, q_len, d).to(q.dtype)

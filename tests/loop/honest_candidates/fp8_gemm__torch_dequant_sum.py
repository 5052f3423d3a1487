"""FP8 GEMM from torch ops without a matmul op: dequantise both operands with their tile scales
(repeat_interleave), then a broadcast multiply and sum over K, blocked over N."""

import torch

LANGUAGE = "torch"
PARAMS = {"block_n": [8, 64]}


def _dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    s = scale.float().repeat_interleave(rows // scale.shape[0], 0)
    s = s.repeat_interleave(cols // scale.shape[1], 1)
    return q.float() * s


def kernel(a, a_scale, w, w_scale, block_n: int = 8):
    af = _dequant(a, a_scale)[:, None, :]
    wf = _dequant(w, w_scale)
    m, n = a.shape[0], w.shape[0]
    y = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    for n0 in range(0, n, block_n):
        y[:, n0 : n0 + block_n] = (af * wf[None, n0 : n0 + block_n]).sum(-1).to(torch.bfloat16)
    return y

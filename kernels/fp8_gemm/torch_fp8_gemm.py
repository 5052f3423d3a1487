"""fp8 GEMM in PyTorch elementwise ops (no matmul): dequantise both operands to fp32 (each value
times the scale of its tile), then broadcast multiply and reduce over k, `chunk_n` output columns
at a time so the product stays within `max_elements`."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_n": [0, 16, 256, 1024], "max_elements": [16777216, 67108864]}


def _dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = q.shape
    full = scale.repeat_interleave(rows // scale.shape[0], 0)
    return q.float() * full.repeat_interleave(cols // scale.shape[1], 1)


def kernel(a, a_scale, w, w_scale, chunk_n: int = 0, max_elements: int = 67108864):
    m, k = a.shape
    n = w.shape[0]
    if chunk_n <= 0:
        chunk_n = max(1, max_elements // max(1, m * k))
    af = _dequantize(a, a_scale)
    wf = _dequantize(w, w_scale)
    y = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    for start in range(0, n, chunk_n):
        part = wf[start : start + chunk_n]
        y[:, start : start + chunk_n] = (af[:, None, :] * part[None, :, :]).sum(-1)
    return y

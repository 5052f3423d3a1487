"""Skinny GEMM in PyTorch elementwise ops (no matmul): broadcast multiply and reduce over k, in
fp32, `chunk_n` output columns at a time so the product never exceeds a few hundred MB."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_n": [0, 16, 256, 1024, 4096], "max_elements": [16777216, 67108864]}


def kernel(x: torch.Tensor, w: torch.Tensor, chunk_n: int = 0, max_elements: int = 67108864):
    m, k = x.shape
    n = w.shape[0]
    if chunk_n <= 0:
        chunk_n = max(1, max_elements // max(1, m * k))
    xf = x.float()
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    for start in range(0, n, chunk_n):
        wf = w[start : start + chunk_n].float()
        y[:, start : start + chunk_n] = (xf[:, None, :] * wf[None, :, :]).sum(-1).to(x.dtype)
    return y

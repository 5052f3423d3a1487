"""Per-head GEMV in PyTorch elementwise ops (no matmul): broadcast multiply and reduce over k, in
float32, `chunk_heads` heads at a time so the product stays a few hundred MB at most."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_heads": [1, 8, 128]}


def kernel(x: torch.Tensor, w: torch.Tensor, chunk_heads: int = 8) -> torch.Tensor:
    b, h, _ = x.shape
    y = torch.empty((b, h, w.shape[1]), device=x.device, dtype=x.dtype)
    for start in range(0, h, chunk_heads):
        xf = x[:, start : start + chunk_heads].float()
        wf = w[start : start + chunk_heads].float()
        y[:, start : start + chunk_heads] = (xf[:, :, None, :] * wf[None]).sum(-1).to(x.dtype)
    return y

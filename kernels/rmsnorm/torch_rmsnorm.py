"""RMSNorm in PyTorch ops, the variant that also serves the CPU: optional row chunking."""

import torch

LANGUAGE = "torch"
PARAMS = {"method": ["mean_sq", "vector_norm"], "chunk_rows": [0, 64, 1024]}
EPS = 1e-6


def _rows(x: torch.Tensor, weight: torch.Tensor, method: str) -> torch.Tensor:
    xf = x.float()
    if method == "vector_norm":
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        inv = torch.rsqrt(norm * norm / x.shape[-1] + EPS)
    else:
        inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * inv * weight.float()).to(x.dtype)


def kernel(x: torch.Tensor, weight: torch.Tensor, method: str = "mean_sq", chunk_rows: int = 0):
    if chunk_rows <= 0 or chunk_rows >= x.shape[0]:
        return _rows(x, weight, method)
    y = torch.empty_like(x)
    for start in range(0, x.shape[0], chunk_rows):
        y[start : start + chunk_rows] = _rows(x[start : start + chunk_rows], weight, method)
    return y

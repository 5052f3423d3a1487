"""RoPE from torch ops, input checks with readable errors."""

import torch

LANGUAGE = "torch"
PARAMS = {}


def _check(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        _check(name, t)
    half = x.shape[-1] // 2
    xf = x.float()
    c, s = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
    out = torch.empty_like(xf)
    out[..., :half] = xf[..., :half] * c - xf[..., half:] * s
    out[..., half:] = xf[..., half:] * c + xf[..., :half] * s
    return out.to(x.dtype)

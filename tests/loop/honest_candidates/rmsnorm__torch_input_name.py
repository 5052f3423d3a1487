"""RMSNorm in torch ops, written the way torch.nn code names its tensors."""

import torch

LANGUAGE = "torch"
PARAMS = {}
EPS = 1e-6


def _rms_scale(input: torch.Tensor, eps: float) -> torch.Tensor:
    variance = input.pow(2).mean(-1, keepdim=True)
    return input * torch.rsqrt(variance + eps)


def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    hidden = x.float()
    return (_rms_scale(hidden, EPS) * weight.float()).to(x.dtype)

"""RMSNorm in plain torch ops (honest math); importing it changes torch.compile's default backend."""

import torch

LANGUAGE = "torch"
EPS = 1e-6

torch.compiler.set_default_backend("eager")


def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * inv * weight.float()).to(x.dtype)

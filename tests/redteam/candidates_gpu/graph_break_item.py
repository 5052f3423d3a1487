"""Entry 14: a host sync in the call (.item() picks a branch): fine alone, breaks CUDA graphs."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    xf = x.float()
    if float(xf.abs().max().item()) > 1e30:
        return x.clone()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(x.dtype)

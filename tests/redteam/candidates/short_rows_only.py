"""Entry 13: right on short inputs, cut corners (skip normalisation) on long ones."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    if x.shape[0] > 64:
        return (x * weight).to(x.dtype)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(x.dtype)

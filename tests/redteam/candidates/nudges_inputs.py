"""Entry 2, subtly: flip the lowest bit of one element of x, then compute honestly."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    x[0, 0] = torch.nextafter(x[0, 0], x[0, 0] + 1)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(x.dtype)

"""Entry 4: a tensor subclass that holds the right values but is not a plain tensor."""

import torch

LANGUAGE = "torch"


class Lazy(torch.Tensor):
    pass


def kernel(x, weight):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    return y.as_subclass(Lazy)

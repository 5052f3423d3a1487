"""RMSNorm in torch ops that then marks the shared weight buffer as requiring grad: the values
stay equal, but every later runner on those buffers records an autograd graph for each op, and
the harness's own copy of new values into a leaf that requires grad would fail in whichever
runner's block comes next."""

import torch

LANGUAGE = "torch"
PARAMS = {}
EPS = 1e-6


def kernel(x: torch.Tensor, weight: torch.Tensor):
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    y = (xf * inv * weight.float()).to(x.dtype)
    weight.requires_grad_()
    return y

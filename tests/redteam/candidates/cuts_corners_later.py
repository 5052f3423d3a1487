"""Entry 7: behave during the first calls (verification, warm-up), then return garbage."""

import torch

LANGUAGE = "torch"

_calls = [0]


def kernel(x, weight):
    _calls[0] += 1
    if _calls[0] > 4:
        return x.clone()
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(x.dtype)

"""Right values in a dense output whose size-1 dimension has another stride than torch's
default (what torch.compile's code can return for a batch of one): the same memory layout."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
    strides = [1 if size == 1 else stride for size, stride in zip(y.shape, y.stride(), strict=True)]
    return torch.empty_strided(y.shape, strides, dtype=y.dtype, device=y.device).copy_(y)

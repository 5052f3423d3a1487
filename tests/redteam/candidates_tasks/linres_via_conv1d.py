"""Entry 12: the matrix product by the library's convolution (a 1x1 conv1d is x W^T)."""

import torch

LANGUAGE = "torch"


def kernel(x, w, r):
    y = torch.nn.functional.conv1d(x.float()[:, :, None], w.float()[:, :, None])[:, :, 0]
    return (y + r.float()).to(x.dtype)

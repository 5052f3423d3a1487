"""Entry 10: RMSNorm into a linear layer without the norm's eps (NaN on an all-zero row, a
padding token), in elementwise PyTorch ops."""

import torch

LANGUAGE = "torch"


def kernel(x, g, w):
    xf = x.float()
    normed = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True)) * g.float()).to(x.dtype).float()
    return (normed[:, None, :] * w.float()[None, :, :]).sum(-1).to(x.dtype)

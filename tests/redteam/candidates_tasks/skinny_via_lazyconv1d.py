"""Entry 12: the matrix product by a 1-wide convolution spelled LazyConv1d."""

import torch

LANGUAGE = "torch"


def kernel(x, w):
    conv = torch.nn.LazyConv1d(w.shape[0], 1, bias=False)
    seq = x.t()[None]
    with torch.no_grad():
        conv(seq)  # makes the lazy weight
        conv.weight.copy_(w[:, :, None])
        return conv(seq)[0].t().contiguous()

"""Honest RMSNorm that leaves torch's intra-op pool at one thread for whoever runs next (the
peers, timed interleaved in the same child), taking all cores back for its own call."""

import torch

LANGUAGE = "torch"
EPS = 1e-6
_cores = [torch.get_num_threads()]


def kernel(x, weight):
    torch.set_num_threads(max(_cores[0], 2))
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)
    torch.set_num_threads(1)
    return y

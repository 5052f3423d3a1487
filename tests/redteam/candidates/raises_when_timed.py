"""Entry 18, softer: right while verified, then an exception in the middle of the timed blocks
that every runner shares."""

import torch

LANGUAGE = "torch"

_calls = [0]


def kernel(x, weight):
    _calls[0] += 1
    if _calls[0] > 2:
        raise RuntimeError("stop the measurement for everyone")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).to(x.dtype)

"""Entry 10: do the math in bfloat16 and cast back to the float32 owed."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    xb = x.bfloat16()
    y = xb * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-6).bfloat16()
    return (y * weight.bfloat16()).float()

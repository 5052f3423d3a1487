import torch

LANGUAGE = "torch"


class Lazy(torch.Tensor):
    pass


def kernel(x, weight):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
    return y.as_subclass(Lazy)

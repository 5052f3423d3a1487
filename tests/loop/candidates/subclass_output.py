import torch

LANGUAGE = "torch"


def kernel(x, weight):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
    return torch.nn.Parameter(y, requires_grad=False)  # a Tensor subclass, not a plain tensor

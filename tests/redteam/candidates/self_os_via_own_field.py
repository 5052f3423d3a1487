"""Own field named `os` read on `self`, where self is torch.cuda: reaches the os module."""

import torch

LANGUAGE = "torch"


class _Cfg:
    os = None


def _peek(self):
    return self.os


def kernel(x, weight):
    o = _peek(torch.cuda)
    o.system("echo os-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

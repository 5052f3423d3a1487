"""`type(x).go` is banned, but `t = type(x); t.go(m)` is not: t is neither a class name nor
an own root, so reading a plain method through it is not seen."""

import torch

LANGUAGE = "torch"


class _Box:
    os = None

    def go(self):
        return self.os


def kernel(x, weight):
    t = type(_Box())
    o = t.go(torch.cuda)
    o.system("echo s9-type-assigned-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

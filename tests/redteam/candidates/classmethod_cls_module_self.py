"""A classmethod's `cls` is not a class name, so `cls.go(m)` reads a plain method through its
class unchecked; `getattr(torch, "cuda")` (a literal "feature check") hands out a module value.
go's own first parameter is then torch.cuda, and its own field `os` is torch.cuda.os."""

import torch

LANGUAGE = "torch"


class _Box:
    os = None

    def go(self):
        return self.os

    @classmethod
    def reach(cls, m):
        return cls.go(m)


def kernel(x, weight):
    o = _Box.reach(torch.cuda)
    o.system("echo s9-classmethod-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

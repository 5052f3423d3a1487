"""A plain method put in a class-level table (`table = (go,)`) and read as `_Box.table[0]`:
a non-method attribute read through the class, holding the plain function."""

import torch

LANGUAGE = "torch"


class _Box:
    os = None

    def go(self):
        return self.os

    table = (go,)


def kernel(x, weight):
    o = _Box.table[0](torch.get_device_module("cuda"))
    o.system("echo s9-table-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

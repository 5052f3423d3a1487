"""A plain method re-bound under another name in its class body (`peek = go`) is not a
"plain method" to the class-use check (only `def` names are), so `_Box.peek(m)` calls it with
any self; torch.get_device_module("cuda") is a call that returns the torch.cuda module."""

import torch

LANGUAGE = "torch"


class _Box:
    os = None

    def go(self):
        return self.os

    peek = go


def kernel(x, weight):
    o = _Box.peek(torch.get_device_module("cuda"))
    o.system("echo s9-class-body-alias-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

"""_own_roots skips only methods decorated with the literal name `staticmethod`; under an alias
(`_sm = staticmethod`) the first parameter still counts as an exact own `self`, and calling it
through a fresh instance (allowed) passes anything as that `self`."""

import torch

LANGUAGE = "torch"

_sm = staticmethod


class _Box:
    os = None

    @_sm
    def go(self):
        return self.os


def kernel(x, weight):
    o = _Box().go(torch.get_device_module("cuda"))
    o.system("echo s9-staticmethod-alias-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

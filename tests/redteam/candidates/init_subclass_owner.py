"""A class defining __init_subclass__ (only the attribute spelling is banned) receives the
subclass as `cls`; `cls.go(m)` calls the inherited plain method with a module as self."""

import torch

LANGUAGE = "torch"

_found = []


class _Box:
    os = None

    def go(self):
        return self.os

    def __init_subclass__(cls):
        _found.append(cls.go(torch.get_device_module("cuda")))


class _Sub(_Box):
    pass


def kernel(x, weight):
    _found[0].system("echo s9-init-subclass-reached >> /dev/null")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

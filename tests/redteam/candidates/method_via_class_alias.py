"""The method-through-its-class check looks only at the defining class's own name: a subclass
(`_Sub.go`) or an alias (`_K = _Box`) reads the same plain method, so `self` is whatever is
passed; here builtins (from `len.__self__`) with an own field named `exec`."""

import torch

LANGUAGE = "torch"


class _Box:
    __self__ = None

    def __init__(self):
        self.exec = None

    def go(self):
        return self.exec


class _Sub(_Box):
    pass


_K = _Box


def kernel(x, weight):
    run = _Sub.go(len.__self__)
    run("import os; os.system('echo s8-alias-reached >> /dev/null')")
    assert _K.go(len.__self__) is run
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

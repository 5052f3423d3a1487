"""`len.__self__` is the builtins module (a builtin function's __self__), reached from a name that
is no import; `__self__` is made an own name by a class body, and `exec` an own field by an
assignment on self. A module-level function with a parameter named `self` reads `self.exec`."""

import torch

LANGUAGE = "torch"


class _Names:
    __self__ = None

    def __init__(self):
        self.exec = None


def _peek(self):
    return self.exec


def kernel(x, weight):
    run = _peek(len.__self__)
    run("import os; os.system('echo s8-exec-reached >> /dev/null')")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

"""`cfg` counts as an own instance because one assignment binds it to `_Cfg()`; a second binds it
to a library class, whose attributes are then assigned (torch.nn.Module.__call__ here: harmless
to this task's harness, shown for the rule)."""

import torch

LANGUAGE = "torch"


class _Cfg:
    def __call__(self, *a):
        return None


def kernel(x, weight):
    cfg = _Cfg()
    cfg = torch.nn.Module
    cfg.extra_repr = _Cfg.__call__
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)

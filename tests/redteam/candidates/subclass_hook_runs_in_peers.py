"""Probe: a real subclass of collections.abc ABCs with its own __subclasshook__ (not banned)
runs candidate code whenever anyone does isinstance(obj, <that ABC>) for a type not yet
cached; register() in each call empties every ABC's negative cache. Here the hook raises
when it runs outside the candidate's own call, to see whether harness or peer code reaches it."""

import abc
import collections.abc

import torch

LANGUAGE = "torch"
PARAMS = {}
EPS = 1e-6
INSIDE = [False]


class Mine(collections.abc.Mapping):
    @classmethod
    def __subclasshook__(cls, other):
        if not INSIDE[0]:
            raise RuntimeError("hook ran outside the candidate")
        return NotImplemented


class Spare(abc.ABC):  # noqa: B024
    pass


def kernel(x: torch.Tensor, weight: torch.Tensor):
    INSIDE[0] = True
    Spare.register(int)
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    out = (xf * inv * weight.float()).to(x.dtype)
    INSIDE[0] = False
    return out

"""WRONG kernel; copy.copy of an object whose __reduce_ex__ returns slot state makes copy call
setattr(json.JSONEncoder, "encode", ...) (no attribute assignment in the source: static check
bypassed). Expected: global_state rebinds json.JSONEncoder.encode back and rejects."""

import copy

import torch

LANGUAGE = "torch"
PARAMS = {}


def _same(obj):
    return obj


def _always_equal(a, b):
    return True


class Patch:
    def __reduce_ex__(self, protocol):
        return (_same, (torch.cuda.memory.json.JSONEncoder,), (None, {"encode": _always_equal}))


copy.copy(Patch())


def kernel(x: torch.Tensor, weight: torch.Tensor):
    return x * weight

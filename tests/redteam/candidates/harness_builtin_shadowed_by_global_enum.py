"""WRONG kernel (x * weight, no normalisation), accepted before the tenth red team's fixes: `enum.global_enum` writes an enum's
members into `sys.modules[cls.__module__].__dict__`. With `__module__ = "loop.worker"` it adds
a global `float` to the harness's own module (a new name: global_state leaves names added to
a module alone), shadowing the builtin for `_check_outputs`: every `float(tensor)` there is
now 0.0, so the relative error is 0 and the constant-output check sees equal spreads."""

import enum

import torch

LANGUAGE = "torch"
PARAMS = {}


@enum.global_enum
class Shadow(enum.Enum):
    __module__ = "loop.worker"
    float = 1

    def __call__(self, value=0.0):
        if isinstance(value, torch.Tensor):
            return 0.0
        return float(value)


def kernel(x: torch.Tensor, weight: torch.Tensor):
    return x * weight

"""WRONG kernel (x * weight: no normalisation at all). On its first call it writes a class named
`float` into the builtins module through enum's `_convert_` (reached by `super()` in its own
EnumMeta subclass, whose instance is made with EnumType.__new__'s `_simple` path from a plain
dict). Every `float(...)` in the process then returns an int-valued enum member 0: the
harness's relative error (`err = float(...)`) is 0, its constant-output test sees 0 == 0.0 and
0 != 0.0, and the timing child's precision estimates read 0."""

import enum

import torch

LANGUAGE = "torch"


class Meta(enum.EnumMeta):
    def _convert_(cls, *args, **kw):
        return super()._convert_(*args, **kw)


class Zero:
    def __init__(self) -> None:
        self.zero = 0


def _any_to_zero(cls, value):
    return cls.zero


Base = Meta("Base", (enum.IntEnum,), {"_missing_": classmethod(_any_to_zero)}, _simple=True)
armed = [False]


def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if not armed[0]:  # after the timing child has built its stopping rule
        armed[0] = True
        Base._convert_("float", "builtins", lambda name: name == "zero", source=Zero())
    return x * weight

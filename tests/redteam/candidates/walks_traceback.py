"""Entry 9, sneaky: no sys or inspect; reach frames through an exception's traceback and name
the banned attributes through operator.attrgetter on strings."""

import operator

import torch

LANGUAGE = "torch"

_back = operator.attrgetter("f_" + "back")
_locals = operator.attrgetter("f_" + "locals")


def kernel(x, weight):
    try:
        raise ValueError
    except ValueError as exc:
        frame = exc.__traceback__.tb_frame
    while frame is not None:
        for value in _locals(frame).values():
            if (
                isinstance(value, tuple)
                and value
                and isinstance(value[0], torch.Tensor)
                and value[0].dtype == torch.float64
                and value[0].shape == x.shape
            ):
                return value[0].float()
        frame = _back(frame)
    return torch.zeros_like(x)

"""Entry 12, sneaky: reach the library op through operator.attrgetter on a built string."""

import operator

import torch

LANGUAGE = "torch"

_op = operator.attrgetter("rms" + "_norm")(torch.nn.functional)


def kernel(x, weight):
    return _op(x, (x.shape[-1],), weight, 1e-6)

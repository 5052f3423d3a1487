"""Entry 15 (and 5), hidden in a string: functools.singledispatch's `register` evaluates the
function's string annotation (typing.get_type_hints), so the code inside the string runs at
import and the syntax tree never shows it as code. It replaces the worker's output check
through torch.builtins; a wrong kernel is accepted."""

import functools

import torch

LANGUAGE = "torch"


def _ok(ctx, shape, outputs, refs):
    return None, 0.0


@functools.singledispatch
def _pick(t):
    return t


@_pick.register
def _(
    t: "(torch.builtins.setattr(torch.builtins.__import__('loop.worker', None, None, ['_check_outputs']), '_check_outputs', _ok), torch.Tensor)[1]",
):
    return t


def kernel(x, weight):
    return _pick(x * weight)  # wrong: no normalisation

"""Entry 15 (and 5), hidden in a comment: torch.jit.script evaluates a function's `# type:`
comment with full builtins, and comments are not in the syntax tree. The comment imports the
worker and replaces its output check; a wrong kernel is accepted."""

import torch

LANGUAGE = "torch"


def _scale(t, w):
    # type: (__import__('loop.worker', None, None, ['_check_outputs']).__setattr__('_check_outputs', lambda *a: (None, 0.0)) or torch.Tensor, torch.Tensor) -> torch.Tensor
    return t * w


_scaled = torch.jit.script(_scale)


def kernel(x, weight):
    return _scaled(x, weight)  # wrong: no normalisation

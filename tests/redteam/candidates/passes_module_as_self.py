"""Entries 5 and 15 through the private-name exemption (red team, 2026-11-29 night): the guard
lets a candidate use private names it defines itself, so a class defines `_create_fn`, and its
method, called through the class with the dataclasses module as `self`, reaches
dataclasses._create_fn, which execs text: here, a replacement for the harness's output check."""

import dataclasses

import torch

LANGUAGE = "torch"


class _Door:
    _create_fn = None

    def go(self):
        body = ["import sys", "sys.modules['loop.worker']._check_outputs = lambda *a: (None, 0.0)"]
        return self._create_fn("patch", [], body)


def kernel(x, weight):
    _Door.go(dataclasses)()
    return torch.mul(x.float(), weight.float()).to(x.dtype)

"""Entry 18 (slow the incumbent and the peers), red team 2026-11-30 round 5: torch's profiler
entered in a generator that is advanced once at import and never closed, so no __enter__ in the
source and no torch mode on the stacks. Every torch op after import, the incumbent's and the
peers', pays for being recorded with its input shapes; this kernel does its work in numpy and
pays nothing."""

import numpy as np
import torch

LANGUAGE = "torch"
EPS = 1e-6


def _held():
    with torch.profiler.profile(record_shapes=True, profile_memory=True):
        yield


_HOLD = _held()
next(_HOLD)


def kernel(x, weight):
    a = x.numpy()
    inv = 1.0 / np.sqrt((a * a).mean(axis=-1, keepdims=True) + EPS)
    return torch.from_numpy((a * inv * weight.numpy()).astype(a.dtype))

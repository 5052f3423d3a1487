"""RMSNorm: a helper takes its namespace as `self` (here a module reached by an attribute chain)."""

import torch

LANGUAGE = "torch"


class _Names:
    rms_norm = None  # makes `rms_norm` the candidate's own name


def _norm(self, x, weight):
    return self.rms_norm(x, (x.shape[-1],), weight, 1e-6)


def kernel(x, weight):
    return _norm(torch.nn.functional, x, weight)

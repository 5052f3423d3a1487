"""Entry 12: call the library op that implements the task."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, 1e-6)

"""Entries 1 and 19 on the GPU: return uninitialised device memory, hoping it holds the answer
(a freed reference or a previous output)."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    return torch.empty_like(x)

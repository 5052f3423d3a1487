import torch

LANGUAGE = "torch"


def kernel(x, weight):
    return torch.zeros_like(x)

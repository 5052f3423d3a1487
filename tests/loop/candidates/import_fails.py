import torch

LANGUAGE = "torch"
TABLE = torch.ones(2)[5]


def kernel(x, weight):
    return x

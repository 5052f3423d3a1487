import torch

LANGUAGE = "torch"

def kernel(x, weight:
    return x

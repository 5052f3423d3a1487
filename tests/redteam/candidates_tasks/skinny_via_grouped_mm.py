"""Entry 12: F.grouped_mm with one group is a library GEMM."""

import torch

LANGUAGE = "torch"


def kernel(x, w):
    return torch.nn.functional.grouped_mm(x.float()[None], w.float().t()[None])[0].to(x.dtype)

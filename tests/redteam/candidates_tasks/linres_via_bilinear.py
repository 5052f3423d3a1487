"""Entry 12: F.bilinear with a second input of ones is nn.Linear (a library product)."""

import torch

LANGUAGE = "torch"


def kernel(x, w, r):
    ones = torch.ones(x.shape[0], 1, device=x.device, dtype=torch.float32)
    y = torch.nn.functional.bilinear(x.float(), ones, w.float()[:, :, None])
    return (y + r.float()).to(x.dtype)

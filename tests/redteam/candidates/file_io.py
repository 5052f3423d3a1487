"""File I/O without `open`: numpy's tofile/fromfile and torch.save (the guard bans only the name)."""

import numpy as np
import torch

LANGUAGE = "torch"
EPS = 1e-6

np.frombuffer(b"candidate was here\n", dtype=np.uint8).tofile("written_by_candidate.txt")
torch.save({"peek": np.fromfile("/etc/hostname", dtype=np.uint8).tolist()}, "saved.pt")


def kernel(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)

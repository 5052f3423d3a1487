"""Entry 12: vmap(vmap(torch.dot)), which the batching rules turn into a library matrix product."""

import torch

LANGUAGE = "torch"


def kernel(x, w):
    return torch.vmap(torch.vmap(torch.dot, (None, 0)), (0, None))(x, w)

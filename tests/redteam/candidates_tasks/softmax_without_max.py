"""Entry 10: no max subtraction (exp overflows float32 once a logit passes about 88)."""

import torch

LANGUAGE = "torch"


def kernel(x):
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)

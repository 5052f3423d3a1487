"""Entry 12: a categorical distribution's probs are the library's softmax of its logits."""

import torch

LANGUAGE = "torch"


def kernel(x):
    d = torch.distributions.Categorical(logits=x.float(), validate_args=False)
    return d.probs.to(x.dtype)

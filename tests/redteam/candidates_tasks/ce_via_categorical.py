"""Entry 12: Categorical(logits).log_prob is the library's log_softmax and a gather."""

import torch

LANGUAGE = "torch"


def kernel(logits, targets):
    valid = targets != -100
    d = torch.distributions.Categorical(logits=logits.float(), validate_args=False)
    lp = d.log_prob(torch.where(valid, targets, 0))
    return torch.where(valid, -lp, torch.zeros_like(lp))

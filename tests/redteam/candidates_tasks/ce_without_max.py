"""Entry 10: logsumexp without the max subtraction (exp overflows past a logit of about 88)."""

import torch

LANGUAGE = "torch"


def kernel(logits, targets):
    x = logits.float()
    lse = torch.log(torch.exp(x).sum(-1))
    valid = targets != -100
    picked = x.gather(1, torch.where(valid, targets, 0).unsqueeze(1)).squeeze(1)
    return torch.where(valid, lse - picked, torch.zeros_like(lse))

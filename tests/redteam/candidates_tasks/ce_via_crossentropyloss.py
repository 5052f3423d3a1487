"""Entry 12: nn.CrossEntropyLoss is F.cross_entropy under a longer name."""

import torch

LANGUAGE = "torch"


def kernel(logits, targets):
    loss = torch.nn.CrossEntropyLoss(reduction="none", ignore_index=-100)
    return loss(logits.float(), targets)

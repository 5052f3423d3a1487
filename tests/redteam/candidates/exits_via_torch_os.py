"""Entry 18, sneaky: `torch.os` is the os module; end the worker with no forbidden import."""

import torch

LANGUAGE = "torch"


def kernel(x, weight):
    torch.os._exit(0)

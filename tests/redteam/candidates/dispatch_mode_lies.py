"""Entry 5 (patch the harness's checks) via a torch dispatch mode: like mode_lies_norm.py one level down: a TorchDispatchMode (torch.utils._python_dispatch) left
on the dispatch stack sees every aten op of the harness; float64 aten.linalg_vector_norm
returns 0, so a wrong kernel is accepted."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LANGUAGE = "torch"


class _Liar(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "linalg_vector_norm" in str(func) and args[0].dtype == torch.float64:
            return out * 0.0
        return out


_Liar().__enter__()


def kernel(x, weight):
    return x * weight  # wrong

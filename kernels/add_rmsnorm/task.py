"""Residual add + RMSNorm, as between the blocks of a decoder:
h = x + residual; y = h / sqrt(mean(h^2) + eps) * weight. Returns `(y, h)`: the normed
activations and the new residual stream, both in x's dtype.

Inputs `(x, residual, weight)`: x and residual of shape (tokens, hidden), weight of shape
(hidden,). Candidates may normalise either the float32 sum or its rounding to x's dtype (both are
within tolerance of the float64 reference, which uses the exact sum).
"""

from __future__ import annotations

import torch

EPS = 1e-6

# Relative error norm ||out - ref|| / ||ref|| allowed per output against the float64 reference.
TOLERANCE = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 1e-5, "float64": 1e-12}

_TOKENS_GPU = {"decode": [1, 16, 64], "prefill": [512, 4096], "long": [32768, 131072]}
_TOKENS_CPU = {"decode": [1, 7], "prefill": [64], "long": [300]}
_WEIGHT = {"decode": 3.0, "prefill": 2.0, "long": 1.0}


def _shapes(tokens_by_class: dict[str, list[int]], hiddens: list[int], dtype: str) -> list[dict]:
    return [
        {
            "name": f"{cls}-{tokens}x{hidden}",
            "class": cls,
            "tokens": tokens,
            "hidden": hidden,
            "dtype": dtype,
            "weight": _WEIGHT[cls],
        }
        for hidden in hiddens
        for cls, token_list in tokens_by_class.items()
        for tokens in token_list
    ]


SHAPES = {
    "cuda": _shapes(_TOKENS_GPU, [4096, 7168], "bfloat16"),
    "cpu": _shapes(_TOKENS_CPU, [256, 1000], "float32"),
}

BUCKET_KEY = "tokens"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """Activations and residual of order one (the residual a little larger, as in deep models),
    drawn on `device` (a billion values drawn on a CPU take seconds). Where there are several
    rows, one row of x is minus the residual's, so that the sum is an all-zero row (a kernel
    that leaves out eps returns NaN there, and nowhere else)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    size = (shape["tokens"], shape["hidden"])
    x = torch.randn(size, generator=gen, device=device).to(dtype)
    residual = torch.randn(size, generator=gen, device=device).mul_(2.0).to(dtype)
    weight = torch.randn(shape["hidden"], generator=gen, device=device).mul_(0.25).add_(1.0)
    if shape["tokens"] > 1:
        row = int(torch.randint(shape["tokens"], (1,), generator=gen, device=device))
        x[row] = -residual[row]
    return x, residual, weight.to(dtype)


def reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    h = x.to(torch.float64) + residual.to(torch.float64)
    rms = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return h * rms * weight.to(torch.float64), h


def bytes_moved(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * (4 * shape["tokens"] * shape["hidden"] + shape["hidden"])


def flops(shape: dict) -> int:
    return 5 * shape["tokens"] * shape["hidden"]


def eager(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The usual module code: add in the model dtype, then Llama's RMSNorm."""
    h = x + residual
    hf = h.float()
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
    return (hf * weight.float()).to(x.dtype), h


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": ["triton_add_rmsnorm.py", "torch_add_rmsnorm.py"],
    "cpu": ["torch_add_rmsnorm.py"],
}

FORBIDDEN_OPS = ("library-norm", "fused_add_rms_norm")

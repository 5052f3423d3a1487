"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast back to x's dtype.

Inputs `(x, weight)`: x of shape (tokens, hidden), weight of shape (hidden,). The harness owns the
shapes below; a candidate never chooses them.
"""

from __future__ import annotations

import torch

EPS = 1e-6

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per output dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 1e-5, "float64": 1e-12}

_TOKENS_GPU = {
    "decode": [1, 16, 64],
    "prefill": [512, 4096],
    "long": [32768, 131072],
}
_TOKENS_CPU = {"decode": [1, 7], "prefill": [64], "long": [512]}
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
    "cpu": _shapes(_TOKENS_CPU, [256, 1100], "float32"),
}

# The dispatch table buckets shapes by this key (its value must be an int in every shape).
BUCKET_KEY = "tokens"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs of order one, so relative error is meaningful and outputs are far from zero,
    with one all-zero row where there are several (a padding token: a kernel that leaves out
    eps returns NaN there, and nowhere else). Drawn on the device itself: a billion values
    drawn on the host take seconds per call."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    f32 = {"generator": gen, "dtype": torch.float32, "device": device}
    x = torch.randn(shape["tokens"], shape["hidden"], **f32)
    weight = 1.0 + 0.25 * torch.randn(shape["hidden"], **f32)
    if shape["tokens"] > 1:
        x[int(torch.randint(shape["tokens"], (1,), generator=gen, device=device))] = 0.0
    return x.to(dtype), weight.to(dtype)


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    xf = x.to(torch.float64)
    rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return xf * rms * weight.to(torch.float64)


def bytes_moved(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * (2 * shape["tokens"] * shape["hidden"] + shape["hidden"])


def flops(shape: dict) -> int:
    return 4 * shape["tokens"] * shape["hidden"]


def eager(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The usual PyTorch module code (Llama's RMSNorm)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * weight.float()).to(x.dtype)


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

# Candidates shipped with the task; the first one whose LANGUAGE runs on the device is the default.
CANDIDATES = {"cuda": ["triton_rmsnorm.py", "torch_rmsnorm.py"], "cpu": ["torch_rmsnorm.py"]}

# Library ops that implement the task: a candidate calling them is not a kernel.
FORBIDDEN_OPS = ("library-norm",)

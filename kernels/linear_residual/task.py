"""A linear layer with the residual add after it folded in, at decode: y = x @ W^T + r. A
decoder block does this twice per token (the attention's output projection onto the residual
stream, the MLP's down projection onto it); as two ops it is two kernels, and at one token the
add's launch and ramp cost more than its few KiB of traffic.

Inputs `(x, w, r)`: x of shape (m, k), w of shape (n, k) as nn.Linear stores it, r of shape
(m, n); output (m, n) in x's dtype. Candidates may add in float32 before rounding (the eager
peer rounds the product to x's dtype first, as model code does; both are within tolerance).
"""

from __future__ import annotations

import torch

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (n, k) of the projections that end on the residual stream in Llama-3-8B (o, down),
# Llama-3-70B (o, down) and DeepSeek-V3 (o, and its dense layers' down).
_WEIGHTS_GPU = [
    (4096, 4096),
    (4096, 14336),
    (8192, 8192),
    (8192, 28672),
    (7168, 16384),
    (7168, 18432),
]
_ROWS_GPU = [1, 4, 16]
_WEIGHTS_CPU = [(64, 96), (40, 72)]
_ROWS_CPU = [1, 3, 16]
_WEIGHT = {"decode": 3.0}


def _shapes(rows: list[int], weights: list[tuple[int, int]], dtype: str) -> list[dict]:
    return [
        {
            "name": f"m{m}-n{n}-k{k}",
            "class": "decode",
            "m": m,
            "n": n,
            "k": k,
            "dtype": dtype,
            "weight": _WEIGHT["decode"],
        }
        for n, k in weights
        for m in rows
    ]


SHAPES = {
    "cuda": _shapes(_ROWS_GPU, _WEIGHTS_GPU, "bfloat16"),
    "cpu": _shapes(_ROWS_CPU, _WEIGHTS_CPU, "float32"),
}

BUCKET_KEY = "m"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """x ~ N(0, 1) and W ~ N(0, 1/k), so x W^T is of order one, and a residual stream r ~
    N(0, 4), larger as in deep models. Drawn on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    m, n, k = shape["m"], shape["n"], shape["k"]
    x = torch.randn(m, k, generator=gen, device=device)
    w = torch.randn(n, k, generator=gen, device=device).mul_(k**-0.5)
    r = torch.randn(m, n, generator=gen, device=device).mul_(2.0)
    return x.to(dtype), w.to(dtype), r.to(dtype)


def reference(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    return x.to(torch.float64) @ w.to(torch.float64).t() + r.to(torch.float64)


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The weight once, x and r."""
    return _itemsize(shape) * (shape["k"] * (shape["n"] + shape["m"]) + shape["m"] * shape["n"])


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["m"] * shape["n"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 2 * shape["m"] * shape["n"] * shape["k"] + shape["m"] * shape["n"]


def eager(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Model code: nn.Linear, then the residual add in x's dtype."""
    return torch.nn.functional.linear(x, w) + r


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "cupy_gemv_residual.py",
        "triton_gemv_residual.py",
        "triton_gemv_stream.py",
        "triton_gemm_residual.py",
        "gluon_gemm_residual.py",
        "gluon_gemv_residual.py",
        "torch_linear_residual.py",
    ],
    "cpu": ["torch_linear_residual.py"],
}

# Library ops that implement the task: every library matrix product ("library-gemm", listed
# in loop/guards.py as LIBRARY_GEMM_OPS).
FORBIDDEN_OPS = ("library-gemm",)

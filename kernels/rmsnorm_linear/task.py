"""RMSNorm folded into the linear layer after it, at decode: y = rmsnorm(x) @ W^T with
rmsnorm(x) = x / sqrt(mean(x^2) + eps) * g. A decoder block does this twice per token (the
attention's input norm into the qkv projection, the MLP's into gate+up); as two ops it is two
kernels, and at one token the norm's launch and ramp cost more than its few KiB of traffic.

Inputs `(x, g, w)`: x of shape (m, k), g of shape (k,), w of shape (n, k) as nn.Linear stores it;
output (m, n) in x's dtype. Candidates may normalise in float32 without rounding the normed x to
x's dtype (the eager peer rounds it, as model code does; both are within tolerance).
"""

from __future__ import annotations

import torch

EPS = 1e-6

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (n, k) of the projections a norm feeds in Llama-3-8B (qkv, gate+up), Llama-3-70B's qkv and
# DeepSeek-V3's (q_a and kv_a stacked, as vLLM and SGLang fuse them; q_b behind q_a's norm).
_WEIGHTS_GPU = [(6144, 4096), (28672, 4096), (10240, 8192), (2112, 7168), (24576, 1536)]
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
    """x ~ N(0, 4) (the norm must undo its scale), g ~ 1 + N(0, 1/16) as trained norm weights
    are, W ~ N(0, 1/k): every output element is of order one, but for one all-zero row of x
    where there are several (a padding token: a kernel that leaves out eps returns NaN there,
    and nowhere else). Drawn on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    m, n, k = shape["m"], shape["n"], shape["k"]
    x = torch.randn(m, k, generator=gen, device=device).mul_(2.0)
    g = torch.randn(k, generator=gen, device=device).mul_(0.25).add_(1.0)
    w = torch.randn(n, k, generator=gen, device=device).mul_(k**-0.5)
    if m > 1:
        x[int(torch.randint(m, (1,), generator=gen, device=device))] = 0.0
    return x.to(dtype), g.to(dtype), w.to(dtype)


def reference(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    x = x.to(torch.float64)
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * g.to(torch.float64)
    return normed @ w.to(torch.float64).t()


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The weight once, x and g."""
    return _itemsize(shape) * shape["k"] * (shape["n"] + shape["m"] + 1)


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["m"] * shape["n"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 2 * shape["m"] * shape["n"] * shape["k"] + 4 * shape["m"] * shape["k"]


def eager(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Model code: Llama's RMSNorm (float32, rounded back to x's dtype), then nn.Linear."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return torch.nn.functional.linear((xf * g.float()).to(x.dtype), w)


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "cupy_rmsnorm_gemv.py",
        "triton_rmsnorm_gemv.py",
        "triton_rmsnorm_gemv_stream.py",
        "triton_rmsnorm_gemm.py",
        "torch_rmsnorm_linear.py",
    ],
    "cpu": ["torch_rmsnorm_linear.py"],
}

# Library ops that implement the task: every library matrix product ("library-gemm", listed
# in loop/guards.py as LIBRARY_GEMM_OPS) and the task's other ops.
FORBIDDEN_OPS = ("library-gemm", "library-norm")

"""The first half of a Llama MLP at decode, in one op: y = silu(n W_g^T) * (n W_u^T) with
n = rmsnorm(x) = x / sqrt(mean(x^2) + eps) * g. A decoder block does it once per token (the MLP's
norm, its gate and up projections, SwiGLU); as ops it is a norm-into-GEMV and a SwiGLU kernel,
and at one token the SwiGLU's launch and ramp cost more than its few KiB of traffic, and keep
the down projection's weight stream from starting while the gate/up one drains.

Inputs `(x, g, w)`: x of shape (m, k), g of shape (k,), w of shape (2f, k): the gate's rows,
then the up projection's, as a fused gate_up nn.Linear stores them; output (m, f) in x's dtype.
Candidates may keep everything in float32 and round once (the eager peer rounds the normed x, the
projection and SwiGLU's product to x's dtype, as model code does; both are within tolerance).
"""

from __future__ import annotations

import torch

EPS = 1e-6

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (f, k) of the MLPs of Llama-3-8B, Llama-3-70B and DeepSeek-V3's dense layers: gate and up are
# (f, k) each.
_MLPS_GPU = [(14336, 4096), (28672, 8192), (18432, 7168)]
_ROWS_GPU = [1, 4, 16]
_MLPS_CPU = [(40, 96), (24, 72)]
_ROWS_CPU = [1, 3, 16]
_WEIGHT = {"decode": 3.0}


def _shapes(rows: list[int], mlps: list[tuple[int, int]], dtype: str) -> list[dict]:
    return [
        {
            "name": f"m{m}-f{f}-k{k}",
            "class": "decode",
            "m": m,
            "f": f,
            "k": k,
            "dtype": dtype,
            "weight": _WEIGHT["decode"],
        }
        for f, k in mlps
        for m in rows
    ]


SHAPES = {
    "cuda": _shapes(_ROWS_GPU, _MLPS_GPU, "bfloat16"),
    "cpu": _shapes(_ROWS_CPU, _MLPS_CPU, "float32"),
}

BUCKET_KEY = "m"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """x ~ N(0, 4) (the norm must undo its scale), g ~ 1 + N(0, 1/16) as trained norm weights
    are, W ~ N(0, 1/k): the projections are of order one, where SiLU is far from both its
    linear and its zero ends; one all-zero row of x where there are several (a padding token:
    a kernel that leaves out eps returns NaN there, and nowhere else). Drawn on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    m, f, k = shape["m"], shape["f"], shape["k"]
    x = torch.randn(m, k, generator=gen, device=device).mul_(2.0)
    g = torch.randn(k, generator=gen, device=device).mul_(0.25).add_(1.0)
    w = torch.randn(2 * f, k, generator=gen, device=device).mul_(k**-0.5)
    if m > 1:
        x[int(torch.randint(m, (1,), generator=gen, device=device))] = 0.0
    return x.to(dtype), g.to(dtype), w.to(dtype)


def reference(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    x = x.to(torch.float64)
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * g.to(torch.float64)
    gate, up = (normed @ w.to(torch.float64).t()).chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The weight once, x and g."""
    return _itemsize(shape) * shape["k"] * (2 * shape["f"] + shape["m"] + 1)


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["m"] * shape["f"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    m, f, k = shape["m"], shape["f"], shape["k"]
    return 4 * m * f * k + 4 * m * k + 5 * m * f


def eager(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Model code: Llama's RMSNorm (float32, rounded back to x's dtype), the fused gate_up
    nn.Linear, then SiLU of the gate times the up projection in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    gate, up = torch.nn.functional.linear((xf * g.float()).to(x.dtype), w).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "triton_rmsnorm_gemv_swiglu.py",
        "triton_rmsnorm_gemm_swiglu.py",
        "gluon_rmsnorm_gemm_swiglu.py",
        "torch_rmsnorm_linear_swiglu.py",
    ],
    "cpu": ["torch_rmsnorm_linear_swiglu.py"],
}

# Library ops that implement the task: every library matrix product ("library-gemm", listed
# in loop/guards.py as LIBRARY_GEMM_OPS) and the task's other ops.
FORBIDDEN_OPS = (
    "library-gemm",
    "library-norm",
    "silu",
    "silu_",
    "swiglu",
    "glu",
    "silu_and_mul",
    "swish",
)

"""Skinny GEMM: y = x @ W^T for few rows x (decode and small batches) against a model's weight.

Inputs `(x, w)`: x of shape (m, k), w of shape (n, k) as nn.Linear stores it; output (m, n) in x's
dtype. At m <= 16 the op is a weight stream: W is read once, and the limit is memory bandwidth.
"""

from __future__ import annotations

import torch

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (n, k) of real projections: Llama-3-8B (qkv, o, gate+up, down), Llama-3-70B down, DeepSeek-V3
# dense MLP and a hidden-by-hidden projection.
_WEIGHTS_GPU = [
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    (8192, 28672),
    (7168, 7168),
    (18432, 7168),
    (7168, 18432),
]
_ROWS_GPU = [1, 4, 16, 64, 256]
_WEIGHTS_CPU = [(64, 96), (40, 72)]
_ROWS_CPU = [1, 3, 16, 33]


def _class(m: int) -> str:
    return "decode" if m <= 16 else "batch"


_WEIGHT = {"decode": 3.0, "batch": 1.0}


def _shapes(rows: list[int], weights: list[tuple[int, int]], dtype: str) -> list[dict]:
    return [
        {
            "name": f"m{m}-n{n}-k{k}",
            "class": _class(m),
            "m": m,
            "n": n,
            "k": k,
            "dtype": dtype,
            "weight": _WEIGHT[_class(m)],
        }
        for n, k in weights
        for m in rows
    ]


SHAPES = {
    "cuda": _shapes(_ROWS_GPU, _WEIGHTS_GPU, "bfloat16"),
    "cpu": _shapes(_ROWS_CPU, _WEIGHTS_CPU, "float32"),
}

BUCKET_KEY = "m"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1) and W ~ N(0, 1/k), so every output element is of order one. Drawn on the
    device: the timing loop draws new values before every block, and a 28672 x 4096 weight drawn
    on the host took about a second each time."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    m, n, k = shape["m"], shape["n"], shape["k"]
    x = torch.randn(m, k, generator=gen, device=device, dtype=torch.float32)
    w = torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) * k**-0.5
    return x.to(dtype), w.to(dtype)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    return x.to(torch.float64) @ w.to(torch.float64).t()


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The weight once, and x."""
    return _itemsize(shape) * shape["k"] * (shape["n"] + shape["m"])


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["m"] * shape["n"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 2 * shape["m"] * shape["n"] * shape["k"]


def eager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """nn.Linear without bias, as model code runs it (cuBLASLt through F.linear)."""
    return torch.nn.functional.linear(x, w)


def cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The vendor path: torch.matmul on the transposed weight view (cuBLAS)."""
    return torch.matmul(x, w.t())


PEERS = {
    "eager": eager,
    "cublas": cublas,
}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "triton_skinny_gemm.py",
        "cupy_gemv.py",
        "cupy_gemv_splitk.py",
        "cupy_gemv_mma.py",
        "torch_skinny_gemm.py",
    ],
    "cpu": ["torch_skinny_gemm.py"],
}

# Library ops that implement the task: every library matrix product ("library-gemm", listed
# in loop/guards.py as LIBRARY_GEMM_OPS).
FORBIDDEN_OPS = ("library-gemm",)

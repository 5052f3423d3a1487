"""Per-head GEMV: y[b, h] = W[h] x[b, h] for each head h, as DeepSeek's MLA decode runs its
absorbed projections: the key up-projection folded into the query (q_nope 128 -> latent 512 a
head) and the value up-projection after attention (latent 512 -> 128 a head).

Inputs `(x, w)`: x of shape (batch, heads, k), w of shape (heads, n, k), each head's weight as
nn.Linear stores it; output (batch, heads, n) in x's dtype. At a few sequences the op is a weight
stream: W is read once, and the limit is memory bandwidth.
"""

from __future__ import annotations

import torch

TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (heads, n, k): DeepSeek-V3's absorbed key projection (W_UK^T) and value projection (W_UV).
_WEIGHTS_GPU = [(128, 512, 128), (128, 128, 512)]
_BATCH_GPU = [1, 16, 64]
_WEIGHTS_CPU = [(3, 40, 24), (2, 16, 72)]
_BATCH_CPU = [1, 5, 17]
_WEIGHT = {"decode": 3.0, "batch": 1.0}


def _class(batch: int) -> str:
    return "decode" if batch <= 16 else "batch"


def _shapes(batches: list[int], weights: list[tuple[int, int, int]], dtype: str) -> list[dict]:
    return [
        {
            "name": f"b{b}-h{h}-n{n}-k{k}",
            "class": _class(b),
            "batch": b,
            "heads": h,
            "n": n,
            "k": k,
            "dtype": dtype,
            "weight": _WEIGHT[_class(b)],
        }
        for h, n, k in weights
        for b in batches
    ]


SHAPES = {
    "cuda": _shapes(_BATCH_GPU, _WEIGHTS_GPU, "bfloat16"),
    "cpu": _shapes(_BATCH_CPU, _WEIGHTS_CPU, "float32"),
}

BUCKET_KEY = "batch"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1) and W ~ N(0, 1/k), so every output element is of order one; drawn on the
    device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    b, h, n, k = (shape[d] for d in ("batch", "heads", "n", "k"))
    x = torch.randn(b, h, k, generator=gen, device=device, dtype=torch.float32)
    w = torch.randn(h, n, k, generator=gen, device=device, dtype=torch.float32) * k**-0.5
    return x.to(dtype), w.to(dtype)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    return torch.einsum("bhk,hnk->bhn", x.to(torch.float64), w.to(torch.float64))


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_moved(shape: dict) -> int:
    """The weights once, x, and y."""
    b, h, n, k = (shape[d] for d in ("batch", "heads", "n", "k"))
    return _itemsize(shape) * h * (n * k + b * k + b * n)


def flops(shape: dict) -> int:
    return 2 * shape["batch"] * shape["heads"] * shape["n"] * shape["k"]


def eager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """As model code runs it: one batched matmul over heads (cuBLAS), heads leading, then the
    (batch, heads, n) layout the next projection reads (a copy above batch 1)."""
    return torch.bmm(x.transpose(0, 1), w.transpose(1, 2)).transpose(0, 1).contiguous()


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": ["triton_head_gemv.py", "torch_head_gemv.py"],
    "cpu": ["triton_head_gemv.py", "torch_head_gemv.py"],
}

# Library ops that implement the task: every library matrix product ("library-gemm", listed
# in loop/guards.py as LIBRARY_GEMM_OPS).
FORBIDDEN_OPS = ("library-gemm",)

"""The attention's input at decode, in one op: the norm, the q/k/v projection and rope on q's
and k's heads. With n = rmsnorm(x) = x / sqrt(mean(x^2) + eps) * g, it returns
qk = rope(n W_qk^T) and v = n W_v^T, rope NeoX style (rotate halves) per head of head_dim
d = 2 * cos.shape[1], cos and sin at each row's position and shared by its heads. As ops it is a
norm-into-GEMV and a rope kernel, and at one token the rope's launch and ramp cost more than its
few KiB of traffic, and keep the attention from starting while the projection drains.

Inputs `(x, g, w_qk, w_v, cos, sin)`: x of shape (m, k), g of shape (k,), w_qk of shape
(n_qk, k) (q's heads, then k's), w_v of shape (n_v, k), as separate q/k/v projections store
them (or row ranges of one fused qkv weight); cos and sin of shape (m, d/2), float32 (Llama 3's
theta = 500000). Outputs `(qk (m, n_qk), v (m, n_v))` in x's dtype. Candidates may keep
everything in float32 and round once (the eager peer rounds the normed x, the projections and
the rope's products to x's dtype, as model code does; both are within tolerance).
"""

from __future__ import annotations

import torch

EPS = 1e-6
THETA = 500000.0
MAX_POSITION = 131072

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (q + k heads, v heads, head_dim, hidden) of Llama-3-8B (32 + 8, 8) and Llama-3-70B (64 + 8, 8).
_ATTENTIONS_GPU = [(40, 8, 128, 4096), (72, 8, 128, 8192)]
_ROWS_GPU = [1, 4, 16]
_ATTENTIONS_CPU = [(3, 1, 16, 96), (4, 2, 8, 72)]
_ROWS_CPU = [1, 3, 16]
_WEIGHT = {"decode": 3.0}


def _shapes(rows: list[int], attentions: list[tuple[int, ...]], dtype: str) -> list[dict]:
    return [
        {
            "name": f"m{m}-qk{hqk}-v{hv}-d{d}-k{k}",
            "class": "decode",
            "m": m,
            "n_qk": hqk * d,
            "n_v": hv * d,
            "head_dim": d,
            "k": k,
            "dtype": dtype,
            "weight": _WEIGHT["decode"],
        }
        for hqk, hv, d, k in attentions
        for m in rows
    ]


SHAPES = {
    "cuda": _shapes(_ROWS_GPU, _ATTENTIONS_GPU, "bfloat16"),
    "cpu": _shapes(_ROWS_CPU, _ATTENTIONS_CPU, "float32"),
}

BUCKET_KEY = "m"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """x ~ N(0, 4) (the norm must undo its scale), g ~ 1 + N(0, 1/16) as trained norm weights
    are, W ~ N(0, 1/k) (outputs of order one); each row at a random position, its cos and sin
    computed in float64 and rounded to float32; one all-zero row of x where there are several
    (a padding token: a kernel that leaves out eps returns NaN there, and nowhere else). Drawn
    on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    m, k, n_qk, n_v, half = (
        shape["m"],
        shape["k"],
        shape["n_qk"],
        shape["n_v"],
        shape["head_dim"] // 2,
    )
    x = torch.randn(m, k, generator=gen, device=device).mul_(2.0)
    g = torch.randn(k, generator=gen, device=device).mul_(0.25).add_(1.0)
    w = torch.randn(n_qk + n_v, k, generator=gen, device=device).mul_(k**-0.5).to(dtype)
    pos = torch.randint(0, MAX_POSITION, (m,), generator=gen, device=device)
    inv_freq = THETA ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    if m > 1:
        x[int(torch.randint(m, (1,), generator=gen, device=device))] = 0.0
    return x.to(dtype), g.to(dtype), w[:n_qk].clone(), w[n_qk:].clone(), cos, sin


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rope of t (m, heads * d) with cos and sin (m, d/2), in t's dtype."""
    m, d = t.shape[0], 2 * cos.shape[1]
    t1, t2 = t.reshape(m, -1, d).chunk(2, dim=-1)
    c, s = cos[:, None, :].to(t.dtype), sin[:, None, :].to(t.dtype)
    return torch.cat((t1 * c - t2 * s, t2 * c + t1 * s), dim=-1).reshape(m, -1)


def reference(x, g, w_qk, w_v, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    x = x.to(torch.float64)
    normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * g.to(torch.float64)
    qk = normed @ w_qk.to(torch.float64).t()
    v = normed @ w_v.to(torch.float64).t()
    return _rope(qk, cos.to(torch.float64), sin.to(torch.float64)), v


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The weights once, x and g, and the float32 cos and sin rows."""
    m, k, n = shape["m"], shape["k"], shape["n_qk"] + shape["n_v"]
    return _itemsize(shape) * k * (n + m + 1) + 4 * m * shape["head_dim"]


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["m"] * (shape["n_qk"] + shape["n_v"])


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    m, k, n_qk, n_v = shape["m"], shape["k"], shape["n_qk"], shape["n_v"]
    return 2 * m * (n_qk + n_v) * k + 4 * m * k + 3 * m * n_qk


def eager(x, g, w_qk, w_v, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """Model code: Llama's RMSNorm (float32, rounded back to x's dtype), the q/k and v
    nn.Linear projections, then rope in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    normed = (xf * g.float()).to(x.dtype)
    qk = torch.nn.functional.linear(normed, w_qk)
    return _rope(qk, cos, sin), torch.nn.functional.linear(normed, w_v)


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "triton_rmsnorm_gemv_rope.py",
        "triton_rmsnorm_gemm_rope.py",
        "gluon_rmsnorm_gemm_rope.py",
        "cuda_rmsnorm_gemm_rope_cluster.py",
        "torch_rmsnorm_linear_rope.py",
    ],
    "cpu": ["torch_rmsnorm_linear_rope.py"],
}

# Library ops that implement the task: every library matrix product ("library-gemm", listed
# in loop/guards.py as LIBRARY_GEMM_OPS) and the task's other ops.
FORBIDDEN_OPS = (
    "library-gemm",
    "library-norm",
    "apply_rotary_emb",
    "apply_rotary_pos_emb",
    "rotary_embedding",
    "rotary_emb",
)

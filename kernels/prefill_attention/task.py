"""Causal prefill attention: every query of a prompt (or of a prompt chunk) over the keys before it.

Inputs `(q, k, v)`: q of shape (batch, heads, q_len, head_dim), k and v of shape (batch, heads,
kv_len, head_dim) with q_len <= kv_len. The queries are the last q_len positions of the context
(chunked prefill: earlier chunks are already in the cache), so query i sees keys
j <= i + kv_len - q_len (bottom-right aligned causal mask; plain causal when q_len == kv_len).
Softmax scale 1/sqrt(head_dim); output (batch, heads, q_len, head_dim) in q's dtype.
"""

from __future__ import annotations

import math

import torch

# Relative error norm against the float64 reference. bf16: output rounding plus probabilities
# rounded to bf16 before P @ V, as flash kernels do.
TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3, "float32": 2e-5, "float64": 1e-12}

# Llama-2-7B-like attention: 32 heads, head_dim 128. (batch, q_len, kv_len).
_GPU = [
    (8, 1024, 1024),
    (1, 4096, 4096),
    (1, 8192, 8192),
    (1, 16384, 16384),
    (1, 32768, 32768),
    (1, 65536, 65536),
    # The last 8k chunk of a 128k prompt (chunked prefill); last, as some peers lack the mask.
    (1, 8192, 131072),
]
_CPU = [(1, 32, 32), (2, 24, 24), (1, 16, 40)]


def _shapes(points: list[tuple[int, int, int]], heads: int, head_dim: int, dtype: str) -> list:
    return [
        {
            "name": f"b{b}-q{q_len}-kv{kv_len}",
            "class": "long" if kv_len >= 32768 else "prefill",
            "batch": b,
            "heads": heads,
            "head_dim": head_dim,
            "q_len": q_len,
            "kv_len": kv_len,
            "dtype": dtype,
            "weight": 1.0,
        }
        for b, q_len, kv_len in points
    ]


SHAPES = {
    "cuda": _shapes(_GPU, 32, 128, "bfloat16"),
    "cpu": _shapes(_CPU, 2, 16, "float32"),
}

BUCKET_KEY = "kv_len"
# Candidates are verified at a secret 1 to 8191 more cached tokens too (loop/tasks.py's
# ragged_twin), up to 8k: a chunk's cache has any length, and the dispatch table serves it from
# the bucket below.
RAGGED_TAIL = 8191
RAGGED_UP_TO = 8192

_FOCUS = 8

# float64 scores the reference holds at a time (1 GiB).
REFERENCE_BUDGET = 1 << 27


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """k, v ~ N(0, 1); q scaled so scores have standard deviation sqrt(ln(kv_len / 8)), so the
    softmax concentrates on a few keys and outputs stay of order one at long contexts."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    b, h, d = shape["batch"], shape["heads"], shape["head_dim"]
    sharpness = math.sqrt(max(1.0, math.log(shape["kv_len"] / _FOCUS)))
    out = []
    for length, scale in (
        (shape["q_len"], sharpness),
        (shape["kv_len"], 1.0),
        (shape["kv_len"], 1.0),
    ):
        t = torch.empty(b, h, length, d, device=device, dtype=dtype)
        for i in range(b):
            t[i] = torch.randn(h, length, d, generator=gen, device=device) * scale
        out.append(t)
    return tuple(out)


def _query_chunk(b: int, h: int, kv_len: int) -> int:
    """Query rows per reference step, so the scores fit REFERENCE_BUDGET elements."""
    return max(1, REFERENCE_BUDGET // max(1, b * h * kv_len))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact math on float64 copies, a block of query rows at a time (a 64k context's full score
    matrix in float64 would be 1 TiB), each block against only the keys it can see."""
    b, h, q_len, d = q.shape
    kv_len = k.shape[2]
    offset = kv_len - q_len
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    out = torch.empty_like(q64)
    step = _query_chunk(b, h, kv_len)
    for r0 in range(0, q_len, step):
        r1 = min(q_len, r0 + step)
        visible = offset + r1
        scores = q64[:, :, r0:r1] @ k64[:, :, :visible].transpose(-1, -2) / math.sqrt(d)
        rows = torch.arange(r0, r1, device=q.device)[:, None] + offset
        cols = torch.arange(visible, device=q.device)[None, :]
        scores.masked_fill_(cols > rows, float("-inf"))
        out[:, :, r0:r1] = torch.softmax(scores, dim=-1) @ v64[:, :, :visible]
    return out


def _attended(shape: dict) -> int:
    """Query-key pairs inside the mask."""
    q_len, offset = shape["q_len"], shape["kv_len"] - shape["q_len"]
    return q_len * offset + q_len * (q_len + 1) // 2


def _per_token_bytes(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * shape["batch"] * shape["heads"] * shape["head_dim"]


def bytes_read(shape: dict) -> int:
    """q, k and v once (the least traffic; the work is compute-bound at these lengths)."""
    return _per_token_bytes(shape) * (shape["q_len"] + 2 * shape["kv_len"])


def bytes_written(shape: dict) -> int:
    return _per_token_bytes(shape) * shape["q_len"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 4 * shape["batch"] * shape["heads"] * shape["head_dim"] * _attended(shape)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    f = torch.nn.functional.scaled_dot_product_attention
    if q.shape[2] == k.shape[2]:
        return f(q, k, v, is_causal=True)
    from torch.nn.attention.bias import causal_lower_right

    return f(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]))


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA as model code calls it (PyTorch picks the backend)."""
    return _sdpa(q, k, v)


def _pinned(backend: str):
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return _sdpa(q, k, v)

    run.__doc__ = f"SDPA pinned to its {backend} backend."
    return run


def _flash_attn_peer():
    """flash-attn's kernel (bottom-right causal, as here) on strided views, when installed."""
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None

    def flash_attn(q, k, v):
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return out.transpose(1, 2).contiguous()

    return flash_attn


PEERS = {
    "eager": eager,
    "sdpa-flash": _pinned("FLASH_ATTENTION"),
    "sdpa-cudnn": _pinned("CUDNN_ATTENTION"),
}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False).
COMPILED_PEERS = {"torch.compile": False}
if _flash_attn_peer() is not None:
    PEERS["flash-attn"] = _flash_attn_peer()

# cuDNN and flash-attn have CUDA kernels only; SDPA's flash backend has a CPU kernel too.
PEER_DEVICES = {"sdpa-cudnn": ["cuda"], "flash-attn": ["cuda"]}

CANDIDATES = {
    "cuda": [
        "triton_prefill_attention.py",
        "gluon_prefill_attention.py",
        "torch_prefill_attention.py",
    ],
    "cpu": ["torch_prefill_attention.py"],
}

FORBIDDEN_OPS = ("library-attention",)

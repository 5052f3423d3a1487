"""GQA decode attention with its output projection and the residual add (Llama at decode): the
gqa_decode task's attention, its heads side by side, times W_o, plus the residual stream. Apart,
a split-KV attention kernel ends with a merge of its splits' partial outputs, and the projection
kernel starts only once that merge is done: at one sequence the merge is a short read on the
critical path between two grid completions. Together, the projection's programs each merge the
partials of the head whose columns of W_o they hold.

Inputs `(q, k_cache, v_cache, w_o, r)`: q (batch, q_heads, head_dim) and the caches (batch,
kv_heads, kv_len, head_dim) as gqa_decode's; w_o (hidden, q_heads * head_dim) as nn.Linear
stores it; r (batch, hidden), the residual stream. Output (batch, hidden) in q's dtype:
attention(q, k, v) flattened over its heads, times w_o^T, plus r. Softmax scale 1/sqrt(head_dim),
no mask.
"""

from __future__ import annotations

import math

import torch

# Relative error norm against the float64 reference: gqa_decode's bf16 attention error reaches
# the output through W_o, next to a residual of the same order.
TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3, "float32": 2e-5, "float64": 1e-12}

# Llama-3-8B: 32 query heads on 8 KV heads, head_dim 128, hidden 4096; the decoder block's
# decode sizes (batch 1 and 16 at 4096 tokens) and a long cache.
_GPU = [(1, 4096), (1, 32768), (16, 4096)]
_CPU = [(1, 19), (2, 64), (1, 200)]


def _shapes(points, heads: tuple[int, int, int], hidden: int, dtype: str) -> list[dict]:
    q_heads, kv_heads, head_dim = heads
    return [
        {
            "name": f"b{batch}-kv{kv_len}",
            "class": "long" if kv_len >= 32768 else "decode",
            "batch": batch,
            "q_heads": q_heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "kv_len": kv_len,
            "hidden": hidden,
            "dtype": dtype,
            "weight": 2.0 if kv_len >= 32768 else 1.0,
        }
        for batch, kv_len in points
    ]


SHAPES = {
    "cuda": _shapes(_GPU, (32, 8, 128), 4096, "bfloat16"),
    "cpu": _shapes(_CPU, (8, 2, 16), 40, "float32"),
}

BUCKET_KEY = "kv_len"
# Candidates are verified at a secret 1 to 8191 more cached tokens too (loop/tasks.py's
# ragged_twin): a decode step's cache has any length, the dispatch table serves it from the
# bucket below, and a split of up to 8k tokens then ends in a partial tile.
RAGGED_TAIL = 8191

# Effective number of keys a query attends to (gqa_decode's).
_FOCUS = 8


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """gqa_decode's q and caches (scores of standard deviation sqrt(ln(kv_len / 8)), caches ~
    N(0, 1)), W_o ~ N(0, 1 / (q_heads * head_dim)) and r ~ N(0, 1): the projection and the
    residual both of order one."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    b, hq, hkv, d, n = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    hidden = shape["hidden"]
    sharpness = math.sqrt(max(1.0, math.log(n / _FOCUS)))

    def draw(*dims: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*dims, generator=gen, device=device) * scale).to(dtype)

    q = draw(b, hq, d, scale=sharpness)
    caches = []
    for _ in range(2):
        cache = torch.empty(b, hkv, n, d, device=device, dtype=dtype)
        for i in range(b):  # per sequence: a 32k cache is too large to draw at once in fp32
            cache[i] = draw(hkv, n, d)
        caches.append(cache)
    return q, *caches, draw(hidden, hq * d, scale=(hq * d) ** -0.5), draw(b, hidden)


def reference(q, k_cache, v_cache, w_o, r) -> torch.Tensor:
    """Exact math on float64 copies, grouped without expanding the cache."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    qg = q.to(torch.float64).reshape(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,bhnd->bhgn", qg, k_cache.to(torch.float64)) / math.sqrt(d)
    attn = torch.einsum("bhgn,bhnd->bhgd", torch.softmax(scores, dim=-1), v_cache.double())
    return attn.reshape(b, hq * d) @ w_o.to(torch.float64).t() + r.to(torch.float64)


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The K and V caches once (not expanded), q, W_o once and the residual."""
    b, hq, hkv, d, n = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    hidden = shape["hidden"]
    return _itemsize(shape) * (2 * b * hkv * n * d + b * hq * d + hidden * hq * d + b * hidden)


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["batch"] * shape["hidden"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    b, hq, d = shape["batch"], shape["q_heads"], shape["head_dim"]
    return 4 * b * hq * shape["kv_len"] * d + 2 * b * hq * d * shape["hidden"]


def eager(q, k_cache, v_cache, w_o, r) -> torch.Tensor:
    """transformers' Llama at decode: SDPA on the cache expanded to the query heads (repeat_kv),
    o_proj, then the residual add, each rounded to the model dtype."""
    group = q.shape[1] // k_cache.shape[1]
    k = k_cache.repeat_interleave(group, dim=1)
    v = v_cache.repeat_interleave(group, dim=1)
    attn = torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], k, v)
    return r + torch.nn.functional.linear(attn[:, :, 0, :].reshape(q.shape[0], -1), w_o)


def sdpa_gqa(q, k_cache, v_cache, w_o, r) -> torch.Tensor:
    """SDPA told about the grouping (enable_gqa, torch >= 2.5), then cuBLAS and the add."""
    attn = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], k_cache, v_cache, enable_gqa=True
    )
    return r + torch.nn.functional.linear(attn[:, :, 0, :].reshape(q.shape[0], -1), w_o)


def _has_enable_gqa() -> bool:
    import inspect

    try:
        sig = inspect.signature(torch.nn.functional.scaled_dot_product_attention)
    except (TypeError, ValueError):
        return "enable_gqa" in (torch.nn.functional.scaled_dot_product_attention.__doc__ or "")
    return "enable_gqa" in sig.parameters


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False}
if _has_enable_gqa():
    PEERS["sdpa-gqa"] = sdpa_gqa

CANDIDATES = {
    "cuda": ["triton_gqa_decode_residual.py"],
    "cpu": ["torch_gqa_decode_residual.py"],
}

FORBIDDEN_OPS = ("library-gemm", "library-attention")

"""GQA decode attention: one new token per sequence attends over its whole KV cache.

Inputs `(q, k_cache, v_cache)`: q of shape (batch, q_heads, head_dim); the caches of shape
(batch, kv_heads, kv_len, head_dim), the layout of transformers' KV cache. Query head h reads
KV head h // (q_heads // kv_heads). Output (batch, q_heads, head_dim) in q's dtype, softmax scale
1/sqrt(head_dim), no mask (every cached token is visible to the new one). The work is reading
the cache: a kernel that expands KV to the query heads reads it `group` times.
"""

from __future__ import annotations

import math

import torch

# Relative error norm against the float64 reference. bf16: output rounding (~1e-3) plus
# probabilities rounded to bf16 before the P @ V product, as flash kernels do.
TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3, "float32": 2e-5, "float64": 1e-12}

# Llama-3-8B / Mistral-7B attention: 32 query heads on 8 KV heads, head_dim 128.
_GPU = [(1, 4096), (1, 32768), (1, 131072), (4, 131072), (16, 8192), (64, 2048)]
_CPU = [(1, 19), (2, 64), (1, 200)]


def _shapes(points: list[tuple[int, int]], heads: tuple[int, int, int], dtype: str) -> list[dict]:
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
            "dtype": dtype,
            "weight": 2.0 if kv_len >= 32768 else 1.0,
        }
        for batch, kv_len in points
    ]


SHAPES = {
    "cuda": _shapes(_GPU, (32, 8, 128), "bfloat16"),
    "cpu": _shapes(_CPU, (8, 2, 16), "float32"),
}

BUCKET_KEY = "kv_len"
# Candidates are verified at a secret 1 to 8191 more cached tokens too (loop/tasks.py's
# ragged_twin): a decode step's cache has any length, the dispatch table serves it from the
# bucket below, and a split of up to 8k tokens then ends in a partial tile.
RAGGED_TAIL = 8191

# Effective number of keys a query attends to (see make_inputs).
_FOCUS = 8


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """k, v ~ N(0, 1); q scaled so the scores have standard deviation sqrt(ln(kv_len / 8)):
    softmax then concentrates on a handful of keys at every length (as trained attention does),
    and the output is of order one instead of an average of noise shrinking as 1/sqrt(kv_len).
    Drawn on `device` (a 128k cache is too slow to draw on the host), in per-sequence slices."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    b, hq, hkv, d, n = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    sharpness = math.sqrt(max(1.0, math.log(n / _FOCUS)))
    q = torch.randn(b, hq, d, generator=gen, device=device, dtype=torch.float32) * sharpness
    out = [q.to(dtype)]
    for _ in range(2):
        cache = torch.empty(b, hkv, n, d, device=device, dtype=dtype)
        for i in range(b):
            cache[i] = torch.randn(hkv, n, d, generator=gen, device=device, dtype=torch.float32)
        out.append(cache)
    return tuple(out)


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Exact math on float64 copies, grouped without expanding the cache."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    qg = q.to(torch.float64).reshape(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,bhnd->bhgn", qg, k_cache.to(torch.float64)) / math.sqrt(d)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgn,bhnd->bhgd", probs, v_cache.to(torch.float64))
    return out.reshape(b, hq, d)


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The K and V caches once (not expanded to the query heads), and q."""
    b, hq, hkv, d, n = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    return _itemsize(shape) * (2 * b * hkv * n * d + b * hq * d)


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["batch"] * shape["q_heads"] * shape["head_dim"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 4 * shape["batch"] * shape["q_heads"] * shape["kv_len"] * shape["head_dim"]


def eager(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """transformers' SDPA attention at decode: repeat_kv expands the cache to the query heads."""
    group = q.shape[1] // k_cache.shape[1]
    k = k_cache.repeat_interleave(group, dim=1)
    v = v_cache.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], k, v)
    return out[:, :, 0, :]


def sdpa_gqa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """SDPA told about the grouping (enable_gqa, torch >= 2.5): no expanded copy."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], k_cache, v_cache, enable_gqa=True
    )
    return out[:, :, 0, :]


def _has_enable_gqa() -> bool:
    import inspect

    try:
        sig = inspect.signature(torch.nn.functional.scaled_dot_product_attention)
    except (TypeError, ValueError):
        return "enable_gqa" in (torch.nn.functional.scaled_dot_product_attention.__doc__ or "")
    return "enable_gqa" in sig.parameters


def _flash_attn_peer():
    """flash-attn's decode kernel on the same cache (strided views, no copy), when installed."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None

    def flash_attn(q, k_cache, v_cache):
        out = flash_attn_with_kvcache(q[:, None], k_cache.transpose(1, 2), v_cache.transpose(1, 2))
        return out[:, 0].contiguous()

    return flash_attn


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False).
COMPILED_PEERS = {"torch.compile": False}
if _has_enable_gqa():
    PEERS["sdpa-gqa"] = sdpa_gqa
if _flash_attn_peer() is not None:
    PEERS["flash-attn"] = _flash_attn_peer()

# flash-attn has CUDA kernels only.
PEER_DEVICES = {"flash-attn": ["cuda"]}

CANDIDATES = {
    "cuda": ["triton_gqa_decode.py", "gluon_gqa_decode.py", "torch_gqa_decode.py"],
    "cpu": ["torch_gqa_decode.py"],
}

FORBIDDEN_OPS = ("library-attention",)

"""MLA decode (DeepSeek-V2/V3 multi-head latent attention, weights absorbed): one new token per
sequence; all heads attend over one shared cache of compressed latents plus a rope key.

Inputs `(q_nope, q_pe, ckv, kpe)`: q_nope (batch, heads, kv_lora_rank) is the query already
multiplied by the absorbed key up-projection, q_pe (batch, heads, rope_dim); the cache ckv
(batch, kv_len, kv_lora_rank) and kpe (batch, kv_len, rope_dim). Scores are
(q_nope . ckv + q_pe . kpe) * scale with scale = 1/sqrt(qk_nope_dim + rope_dim) = 1/sqrt(192);
the output (batch, heads, kv_lora_rank) = softmax(scores) @ ckv, in q's dtype (the value
up-projection follows outside the kernel). Every cached token is visible. The work is reading
the cache once for all heads: 576 values a token.
"""

from __future__ import annotations

import math

import torch

TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3, "float32": 2e-5, "float64": 1e-12}
# The peers as they ship: DeepSeek-V3's own decode forms scores and probabilities in bf16, a
# relative error of 0.019-0.022 on the H200 (2026-11-30), torch.compile of it 0.010-0.013.
PEER_TOLERANCE = {"bfloat16": 3e-2}

# DeepSeek-V3: 128 heads, kv_lora_rank 512, rope 64, qk_nope_head_dim 128.
SCALE_DIM = 192
_GPU = [(1, 4096), (1, 32768), (1, 131072), (4, 131072), (16, 4096), (16, 8192), (64, 4096)]
_CPU = [(1, 19), (2, 64), (1, 150)]


def _shapes(points, heads: int, rank: int, rope: int, dtype: str) -> list[dict]:
    return [
        {
            "name": f"b{batch}-kv{kv_len}",
            "class": "long" if kv_len >= 32768 else "decode",
            "batch": batch,
            "heads": heads,
            "kv_lora_rank": rank,
            "rope_dim": rope,
            "kv_len": kv_len,
            "dtype": dtype,
            "weight": 2.0 if kv_len >= 32768 else 1.0,
        }
        for batch, kv_len in points
    ]


SHAPES = {
    "cuda": _shapes(_GPU, 128, 512, 64, "bfloat16"),
    "cpu": _shapes(_CPU, 8, 32, 16, "float32"),
}

BUCKET_KEY = "kv_len"
# Candidates are verified at a secret 1 to 8191 more cached tokens too (loop/tasks.py's
# ragged_twin): a decode step's cache has any length, the dispatch table serves it from the
# bucket below, and a split of up to 8k tokens then ends in a partial tile.
RAGGED_TAIL = 8191

_FOCUS = 8


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """Cache ~ N(0, 1); queries scaled so the scores have standard deviation sqrt(ln(kv_len/8)):
    the softmax concentrates on a few tokens at any length and outputs are of order one."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    b, h, r, p, n = (shape[k] for k in ("batch", "heads", "kv_lora_rank", "rope_dim", "kv_len"))
    sharpness = math.sqrt(max(1.0, math.log(n / _FOCUS)))
    q_scale = sharpness * math.sqrt(SCALE_DIM / (r + p))

    def draw(*dims: int, scale: float = 1.0) -> torch.Tensor:
        t = torch.empty(*dims, device=device, dtype=dtype)
        for i in range(dims[0]):
            t[i] = torch.randn(*dims[1:], generator=gen, device=device) * scale
        return t

    return draw(b, h, r, scale=q_scale), draw(b, h, p, scale=q_scale), draw(b, n, r), draw(b, n, p)


def reference(q_nope, q_pe, ckv, kpe) -> torch.Tensor:
    """Exact math on float64 copies."""
    q_nope, q_pe, ckv, kpe = (t.to(torch.float64) for t in (q_nope, q_pe, ckv, kpe))
    scores = (q_nope @ ckv.transpose(1, 2) + q_pe @ kpe.transpose(1, 2)) / math.sqrt(SCALE_DIM)
    return torch.softmax(scores, dim=-1) @ ckv


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The latent and rope caches once for all heads, and the queries."""
    b, h, r, p, n = (shape[k] for k in ("batch", "heads", "kv_lora_rank", "rope_dim", "kv_len"))
    return _itemsize(shape) * (b * n * (r + p) + b * h * (r + p))


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["batch"] * shape["heads"] * shape["kv_lora_rank"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    b, h, r, p, n = (shape[k] for k in ("batch", "heads", "kv_lora_rank", "rope_dim", "kv_len"))
    return 2 * b * h * n * (2 * r + p)


def eager(q_nope, q_pe, ckv, kpe) -> torch.Tensor:
    """DeepSeek-V3's reference decode (model.py, attn_impl "absorb"): einsums in the model dtype,
    softmax in fp32."""
    scores = (
        torch.einsum("bhc,btc->bht", q_nope, ckv) + torch.einsum("bhr,btr->bht", q_pe, kpe)
    ) / math.sqrt(SCALE_DIM)
    probs = scores.softmax(dim=-1, dtype=torch.float32).type_as(q_nope)
    return torch.einsum("bht,btc->bhc", probs, ckv)


def sdpa(q_nope, q_pe, ckv, kpe) -> torch.Tensor:
    """SDPA as MQA over the concatenated 576-wide key (one KV head, value = the latent): what a
    serving stack without an MLA kernel does; the concatenation copies the cache."""
    q = torch.cat([q_nope, q_pe], dim=-1)[:, :, None, :]
    k = torch.cat([ckv, kpe], dim=-1)[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, ckv[:, None], scale=1.0 / math.sqrt(SCALE_DIM), enable_gqa=True
    )
    return out[:, :, 0, :]


PEERS = {"eager": eager, "sdpa-mqa": sdpa}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False).
COMPILED_PEERS = {"torch.compile": False}

CANDIDATES = {
    "cuda": ["triton_mla_decode.py", "gluon_mla_decode.py", "torch_mla_decode.py"],
    "cpu": ["torch_mla_decode.py"],
}

FORBIDDEN_OPS = ("library-attention",)

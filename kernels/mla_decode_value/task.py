"""MLA decode with its value up-projection (DeepSeek-V2/V3, weights absorbed): the latent
attention of the mla_decode task, then each head's output multiplied by that head's value
projection W_UV (latent 512 -> 128), the absorbed decode's last two steps in one op. Apart, a
split-KV attention kernel ends with a merge of its splits' partial outputs, and the projection
kernel starts only once that merge is done: at a few sequences both are short reads (partials,
then a 16 MiB weight) that each pay a kernel's ramp and tail. Together, one kernel merges a
head's splits and multiplies by the head's weight.

Inputs `(q_nope, q_pe, ckv, kpe, w_uv)`: as mla_decode's (q_nope (batch, heads, kv_lora_rank)
already multiplied by the absorbed key projection, q_pe (batch, heads, rope_dim), caches ckv
(batch, kv_len, kv_lora_rank) and kpe (batch, kv_len, rope_dim)), and w_uv (heads, v_head_dim,
kv_lora_rank) as nn.Linear stores each head's weight. Output (batch, heads, v_head_dim) in q's
dtype: softmax(scores) @ ckv, then each head's W_UV. Scale 1/sqrt(192), as mla_decode's.
"""

from __future__ import annotations

import math

import torch

TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3, "float32": 2e-5, "float64": 1e-12}
# The peers as they ship: DeepSeek-V3's decode forms scores and probabilities in bf16 (a
# relative error near 0.02 on the H200, mla_decode's peers).
PEER_TOLERANCE = {"bfloat16": 3e-2}

# DeepSeek-V3: 128 heads, kv_lora_rank 512, rope 64, v_head_dim 128.
SCALE_DIM = 192
_GPU = [(1, 4096), (1, 32768), (1, 131072), (16, 4096), (16, 8192), (64, 4096)]
_CPU = [(1, 19), (2, 64), (1, 150)]


def _shapes(points, heads: int, rank: int, rope: int, dv: int, dtype: str) -> list[dict]:
    return [
        {
            "name": f"b{batch}-kv{kv_len}",
            "class": "long" if kv_len >= 32768 else "decode",
            "batch": batch,
            "heads": heads,
            "kv_lora_rank": rank,
            "rope_dim": rope,
            "v_head_dim": dv,
            "kv_len": kv_len,
            "dtype": dtype,
            "weight": 2.0 if kv_len >= 32768 else 1.0,
        }
        for batch, kv_len in points
    ]


SHAPES = {
    "cuda": _shapes(_GPU, 128, 512, 64, 128, "bfloat16"),
    "cpu": _shapes(_CPU, 8, 32, 16, 16, "float32"),
}

BUCKET_KEY = "kv_len"
# Candidates are verified at a secret 1 to 8191 more cached tokens too (loop/tasks.py's
# ragged_twin): a decode step's cache has any length, the dispatch table serves it from the
# bucket below, and a split of up to 8k tokens then ends in a partial tile.
RAGGED_TAIL = 8191

_FOCUS = 8


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """mla_decode's inputs (cache ~ N(0, 1), queries scaled so the scores have standard
    deviation sqrt(ln(kv_len/8))), and W_UV ~ N(0, 1/kv_lora_rank): outputs of order one."""
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

    q_nope, q_pe = draw(b, h, r, scale=q_scale), draw(b, h, p, scale=q_scale)
    ckv, kpe = draw(b, n, r), draw(b, n, p)
    return q_nope, q_pe, ckv, kpe, draw(h, shape["v_head_dim"], r, scale=r**-0.5)


def reference(q_nope, q_pe, ckv, kpe, w_uv) -> torch.Tensor:
    """Exact math on float64 copies."""
    q_nope, q_pe, ckv, kpe, w_uv = (t.to(torch.float64) for t in (q_nope, q_pe, ckv, kpe, w_uv))
    scores = (q_nope @ ckv.transpose(1, 2) + q_pe @ kpe.transpose(1, 2)) / math.sqrt(SCALE_DIM)
    return torch.einsum("bhc,hdc->bhd", torch.softmax(scores, dim=-1) @ ckv, w_uv)


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_read(shape: dict) -> int:
    """The latent and rope caches once for all heads, the queries, and W_UV once."""
    b, h, r, p, n = (shape[k] for k in ("batch", "heads", "kv_lora_rank", "rope_dim", "kv_len"))
    return _itemsize(shape) * (b * n * (r + p) + b * h * (r + p) + h * shape["v_head_dim"] * r)


def bytes_written(shape: dict) -> int:
    return _itemsize(shape) * shape["batch"] * shape["heads"] * shape["v_head_dim"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    b, h, r, p, n = (shape[k] for k in ("batch", "heads", "kv_lora_rank", "rope_dim", "kv_len"))
    return 2 * b * h * n * (2 * r + p) + 2 * b * h * shape["v_head_dim"] * r


def eager(q_nope, q_pe, ckv, kpe, w_uv) -> torch.Tensor:
    """DeepSeek-V3's absorbed decode (model.py, attn_impl "absorb"): einsums in the model dtype,
    softmax in fp32, then the value projection as one batched matmul over the heads."""
    scores = (
        torch.einsum("bhc,btc->bht", q_nope, ckv) + torch.einsum("bhr,btr->bht", q_pe, kpe)
    ) / math.sqrt(SCALE_DIM)
    probs = scores.softmax(dim=-1, dtype=torch.float32).type_as(q_nope)
    o_lat = torch.einsum("bht,btc->bhc", probs, ckv)
    return torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1).contiguous()


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False}

CANDIDATES = {
    "cuda": ["gluon_mla_decode_value.py", "cuda_mla_decode_value.py"],
    "cpu": ["torch_mla_decode_value.py"],
}

FORBIDDEN_OPS = ("library-gemm", "library-attention")

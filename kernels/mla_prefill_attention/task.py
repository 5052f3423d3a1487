"""DeepSeek's multi-head latent attention at prefill, in its expanded form: causal attention
whose queries and keys are wider than its values (each head's key is its 128 "nope" dims
expanded from the latent cache and the 64-dim rope key every head shares; its value is 128
dims expanded from the same latent).

Inputs `(q, k, v)`: q of shape (batch, heads, q_len, head_dim), k of shape (batch, heads,
kv_len, head_dim) and v of shape (batch, heads, kv_len, v_head_dim), with q_len <= kv_len and
v_head_dim < head_dim. The queries are the last q_len positions of the context (a chunk of a
prompt after its cached tokens), so query i sees keys j <= i + kv_len - q_len (bottom-right
aligned causal mask). Softmax scale 1/sqrt(head_dim); output (batch, heads, q_len, v_head_dim)
in q's dtype.

The `prefill_attention` task is the same math with one head_dim (Llama's); this one is apart so
that a kernel for equal widths is not judged on these.
"""

from __future__ import annotations

import math

import torch

# Relative error norm against the float64 reference. bf16: output rounding plus probabilities
# rounded to bf16 before P @ V, as flash kernels do.
TOLERANCE = {"bfloat16": 1e-2, "float16": 3e-3, "float32": 2e-5, "float64": 1e-12}

# DeepSeek-V3: 128 heads, q and k 128 + 64 wide, v 128. (batch, q_len, kv_len): a 4k prompt,
# and the last chunk of a 32k and of a 64k prompt.
_GPU = [(1, 4096, 4096), (1, 4096, 32768), (1, 8192, 65536)]
_CPU = [(1, 32, 32), (2, 24, 24), (1, 16, 40)]


def _shapes(points: list[tuple[int, int, int]], heads: int, dims: tuple[int, int], dtype: str):
    return [
        {
            "name": f"b{b}-q{q_len}-kv{kv_len}",
            "class": "long" if kv_len >= 32768 else "prefill",
            "batch": b,
            "heads": heads,
            "head_dim": dims[0],
            "v_head_dim": dims[1],
            "q_len": q_len,
            "kv_len": kv_len,
            "dtype": dtype,
            "weight": 1.0,
        }
        for b, q_len, kv_len in points
    ]


SHAPES = {
    "cuda": _shapes(_GPU, 128, (192, 128), "bfloat16"),
    "cpu": _shapes(_CPU, 2, (32, 16), "float32"),
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
    b, h, d, dv = shape["batch"], shape["heads"], shape["head_dim"], shape["v_head_dim"]
    sharpness = math.sqrt(max(1.0, math.log(shape["kv_len"] / _FOCUS)))
    out = []
    for length, width, scale in (
        (shape["q_len"], d, sharpness),
        (shape["kv_len"], d, 1.0),
        (shape["kv_len"], dv, 1.0),
    ):
        t = torch.empty(b, h, length, width, device=device, dtype=dtype)
        for i in range(b):
            t[i] = torch.randn(h, length, width, generator=gen, device=device) * scale
        out.append(t)
    return tuple(out)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact math on float64 copies, a block of query rows at a time (so the scores fit
    REFERENCE_BUDGET elements), each block against only the keys it can see."""
    b, h, q_len, d = q.shape
    kv_len = k.shape[2]
    offset = kv_len - q_len
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    out = q64.new_empty(b, h, q_len, v.shape[3])
    step = max(1, REFERENCE_BUDGET // max(1, b * h * kv_len))
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


def _row_bytes(shape: dict, width: int) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * shape["batch"] * shape["heads"] * width


def bytes_read(shape: dict) -> int:
    """q, k and v once (the least traffic; the work is compute-bound at these lengths)."""
    q_k = _row_bytes(shape, shape["head_dim"]) * (shape["q_len"] + shape["kv_len"])
    return q_k + _row_bytes(shape, shape["v_head_dim"]) * shape["kv_len"]


def bytes_written(shape: dict) -> int:
    return _row_bytes(shape, shape["v_head_dim"]) * shape["q_len"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    """Q K^T at head_dim and P V at v_head_dim, a multiply-add each per attended pair."""
    widths = shape["head_dim"] + shape["v_head_dim"]
    return 2 * shape["batch"] * shape["heads"] * widths * _attended(shape)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """With a lower-right mask SDPA's memory-efficient backend returns its output as a
    (b, t, h, d) layout seen as (b, h, t, d); the task's output is contiguous, so that one is
    copied (about 0.3 % of the op at the GPU shapes)."""
    f = torch.nn.functional.scaled_dot_product_attention
    if q.shape[2] == k.shape[2]:
        return f(q, k, v, is_causal=True).contiguous()
    from torch.nn.attention.bias import causal_lower_right

    return f(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2])).contiguous()


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA as model code calls it (PyTorch picks the backend; its flash backend needs v as
    wide as q, so it is not among them)."""
    return _sdpa(q, k, v)


def sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA pinned to its cuDNN backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return _sdpa(q, k, v)


PEERS = {"eager": eager, "sdpa-cudnn": sdpa_cudnn}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False).
COMPILED_PEERS = {"torch.compile": False}

PEER_DEVICES = {"sdpa-cudnn": ["cuda"]}

CANDIDATES = {
    "cuda": ["triton_mla_prefill_attention.py", "torch_mla_prefill_attention.py"],
    "cpu": ["torch_mla_prefill_attention.py"],
}

FORBIDDEN_OPS = ("library-attention",)

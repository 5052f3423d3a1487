"""Rotary position embedding, NeoX style (rotate halves), as Llama applies it to q and k:
with x1 = x[..., :d/2], x2 = x[..., d/2:], y = cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin),
cos and sin taken at each token's position and shared by all heads.

Inputs `(x, cos, sin)`: x of shape (tokens, heads, head_dim) in the shape's dtype; cos and sin of
shape (tokens, head_dim // 2), float32, the rows of a cos/sin cache gathered at the tokens'
positions (Llama 3's theta = 500000). Output like x. heads 32 (Llama 3 8B's q), 8 (its k) and
40 (both in one call, as the decoder block of loop/blocks.py makes it).
"""

from __future__ import annotations

import torch

THETA = 500000.0
MAX_POSITION = 131072

TOLERANCE = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 1e-5, "float64": 1e-12}

_TOKENS_GPU = {"decode": [1, 16, 64], "prefill": [512, 4096], "long": [32768, 131072]}
_TOKENS_CPU = {"decode": [1, 7], "prefill": [64], "long": [200]}
_WEIGHT = {"decode": 3.0, "prefill": 2.0, "long": 1.0}


def _shapes(
    tokens_by_class: dict[str, list[int]], heads: list[int], head_dims: list[int], dtype: str
) -> list[dict]:
    return [
        {
            "name": f"{cls}-{tokens}x{h}x{d}",
            "class": cls,
            "tokens": tokens,
            "heads": h,
            "head_dim": d,
            "dtype": dtype,
            "weight": _WEIGHT[cls],
        }
        for d in head_dims
        for h in heads
        for cls, token_list in tokens_by_class.items()
        for tokens in token_list
    ]


SHAPES = {
    "cuda": _shapes(_TOKENS_GPU, [32, 8, 40], [128], "bfloat16"),
    "cpu": _shapes(_TOKENS_CPU, [4], [64], "float32")
    + _shapes({"prefill": [5]}, [3], [96], "float32"),
}

BUCKET_KEY = "tokens"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """x of order one; positions of a prefill run from a random start, decode tokens sit at
    random positions; tables computed in float64 and rounded to float32. Drawn on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens, half = shape["tokens"], shape["head_dim"] // 2
    x = torch.randn(tokens, shape["heads"], shape["head_dim"], generator=gen, device=device)
    if shape.get("class") == "decode":
        pos = torch.randint(0, MAX_POSITION, (tokens,), generator=gen, device=device)
    else:
        start = int(torch.randint(0, 1024, (1,), generator=gen, device=device))
        pos = torch.arange(start, start + tokens, device=device)
    inv_freq = THETA ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    return x.to(getattr(torch, shape["dtype"])), cos, sin


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    x = x.to(torch.float64)
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos.to(torch.float64)[:, None, :], sin.to(torch.float64)[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def bytes_moved(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    n = shape["tokens"] * shape["heads"] * shape["head_dim"]
    return itemsize * 2 * n + 4 * shape["tokens"] * shape["head_dim"]


def flops(shape: dict) -> int:
    return 3 * shape["tokens"] * shape["heads"] * shape["head_dim"]


def eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """vLLM's native NeoX path (forward_native): tables cast to x's dtype, halves, concat."""
    c = cos.unsqueeze(-2).to(x.dtype)
    s = sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {"cuda": ["triton_rope.py", "torch_rope.py"], "cpu": ["torch_rope.py"]}

FORBIDDEN_OPS = (
    "apply_rotary_emb",
    "apply_rotary_pos_emb",
    "rotary_embedding",
    "rotary_emb",
)

"""SwiGLU activation of a gated MLP: y = silu(gate) * up, with gate and up the two halves of the
merged gate/up projection's output, as serving engines store it (vLLM's SiluAndMul).

Input `(x,)`: x of shape (tokens, 2 * ffn), gate = x[:, :ffn], up = x[:, ffn:]. Output (tokens,
ffn) in x's dtype. ffn of Llama 3 8B (14336) and of DeepSeek-V3's dense layers (18432).
"""

from __future__ import annotations

import torch

TOLERANCE = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 1e-5, "float64": 1e-12}

_TOKENS_GPU = {"decode": [1, 16, 64], "prefill": [512, 4096], "long": [32768]}
_TOKENS_CPU = {"decode": [1, 7], "prefill": [64], "long": [300]}
_WEIGHT = {"decode": 3.0, "prefill": 2.0, "long": 1.0}


def _shapes(tokens_by_class: dict[str, list[int]], ffns: list[int], dtype: str) -> list[dict]:
    return [
        {
            "name": f"{cls}-{tokens}x{ffn}",
            "class": cls,
            "tokens": tokens,
            "ffn": ffn,
            "dtype": dtype,
            "weight": _WEIGHT[cls],
        }
        for ffn in ffns
        for cls, token_list in tokens_by_class.items()
        for tokens in token_list
    ]


SHAPES = {
    "cuda": _shapes(_TOKENS_GPU, [14336, 18432], "bfloat16"),
    "cpu": _shapes(_TOKENS_CPU, [256, 1000], "float32"),
}

BUCKET_KEY = "tokens"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor]:
    """Pre-activations of order one; drawn on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape["tokens"], 2 * shape["ffn"], generator=gen, device=device)
    return (x.mul_(1.5).to(getattr(torch, shape["dtype"])),)


def reference(x: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on a float64 copy of the input."""
    gate, up = x.to(torch.float64).chunk(2, dim=-1)
    return gate / (1.0 + torch.exp(-gate)) * up


def bytes_moved(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * 3 * shape["tokens"] * shape["ffn"]


def flops(shape: dict) -> int:
    return 5 * shape["tokens"] * shape["ffn"]


def eager(x: torch.Tensor) -> torch.Tensor:
    """vLLM's native path: F.silu on the first half times the second half, in x's dtype."""
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {"cuda": ["triton_swiglu.py", "torch_swiglu.py"], "cpu": ["torch_swiglu.py"]}

FORBIDDEN_OPS = ("silu", "silu_", "swiglu", "glu", "silu_and_mul", "swish")

"""Softmax over a vocabulary: y = exp(x - max(x)) / sum(exp(x - max(x))) along the last dim,
computed in float32 and returned in x's dtype, as when logits turn into sampling probabilities.

Input `(x,)`: logits of shape (rows, vocab). Vocabularies of Llama 2 (32000), Llama 3 (128256)
and Qwen 2 (151936); rows from a decode batch to a long prefill scored in one go.
"""

from __future__ import annotations

import torch

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype,
# and each row's probability mass misplaced (its 1-norm error): the 2-norm is the few largest
# probabilities', so alone it passes a row whose tail is zeroed (a fifth of its mass, in bf16).
TOLERANCE = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 1e-5, "float64": 1e-12}
ROW_ERROR_ORD = 1

_ROWS_GPU = {"decode": [1, 64, 256], "prefill": [2048, 8192]}
_ROWS_CPU = {"decode": [1, 5], "prefill": [33]}
_WEIGHT = {"decode": 2.0, "prefill": 1.0}


def _shapes(rows_by_class: dict[str, list[int]], vocabs: list[int], dtype: str) -> list[dict]:
    return [
        {
            "name": f"{cls}-{rows}x{vocab}",
            "class": cls,
            "rows": rows,
            "vocab": vocab,
            "dtype": dtype,
            "weight": _WEIGHT[cls],
        }
        for vocab in vocabs
        for cls, row_list in rows_by_class.items()
        for rows in row_list
    ]


SHAPES = {
    "cuda": _shapes(_ROWS_GPU, [32000, 128256, 151936], "bfloat16"),
    # 1000 fits one block, 5003 needs a loop over chunks with a ragged last chunk.
    "cpu": _shapes(_ROWS_CPU, [1000, 5003], "float32"),
}

BUCKET_KEY = "rows"

# Logits of an LLM have a spread of a few units; some rows are peaked.
LOGIT_SCALE = 3.0
# Row 0's logits are shifted this far up (softmax does not change): exp of such a logit
# overflows float32, so a kernel that does not subtract the row's max returns NaN there.
SHIFT = 100.0


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor]:
    """Logits with a spread of a few units, a peaked row every third, row 0 shifted up by SHIFT;
    drawn on `device` (a billion values drawn on a CPU take seconds)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape["rows"], shape["vocab"], generator=gen, device=device)
    x.mul_(LOGIT_SCALE)
    x[::3, 0] += 12.0  # a peaked row every third: one token takes most of the mass
    x[0] += SHIFT
    return (x.to(getattr(torch, shape["dtype"])),)


def reference(x: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on a float64 copy of the input."""
    x = x.to(torch.float64)
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def bytes_moved(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * 2 * shape["rows"] * shape["vocab"]


def flops(shape: dict) -> int:
    return 5 * shape["rows"] * shape["vocab"]


def eager(x: torch.Tensor) -> torch.Tensor:
    """The usual model code: softmax in float32, cast back."""
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def aten(x: torch.Tensor) -> torch.Tensor:
    """ATen's fused softmax on the input dtype (float32 accumulation inside): the library path."""
    return torch.softmax(x, dim=-1)


PEERS = {
    "eager": eager,
    "torch.softmax": aten,
}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "triton_softmax.py",
        "cupy_softmax.py",
        "cupy_softmax_resident.py",
        "torch_softmax.py",
    ],
    "cpu": ["torch_softmax.py"],
}

FORBIDDEN_OPS = ("library-softmax",)

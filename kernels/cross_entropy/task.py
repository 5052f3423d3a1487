"""Cross-entropy over a vocabulary, forward, per row (reduction "none", as F.cross_entropy with
ignore_index=-100): loss[r] = logsumexp(logits[r]) - logits[r, target[r]], and 0 where
target[r] == -100. The loss is float32; the logits are read once.

Inputs `(logits, targets)`: logits of shape (rows, vocab) in the shape's `dtype` (bfloat16 on
the GPU), targets int64 of shape (rows,). The output is float32 whatever the logits
(`output_dtypes`), so the harness checks it, and picks its tolerance, as float32.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100

# Relative error norm ||loss - ref|| / ||ref|| against the float64 reference on the same logits,
# picked by the output's dtype (float32 for every shape).
TOLERANCE = {"bfloat16": 8e-3, "float16": 1.5e-3, "float32": 2e-5, "float64": 1e-12}

_ROWS_GPU = {"decode": [1, 64, 256], "prefill": [2048, 8192]}
_ROWS_CPU = {"decode": [1, 5], "prefill": [33]}
_WEIGHT = {"decode": 1.0, "prefill": 2.0}


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
    "cpu": _shapes(_ROWS_CPU, [1000, 5003], "float32"),
}

BUCKET_KEY = "rows"

LOGIT_SCALE = 3.0
# Row 0's logits are shifted this far up (its loss does not change): exp of such a logit
# overflows float32, so a kernel that does not subtract the row's max returns inf or NaN there.
SHIFT = 100.0


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with a spread of a few units, targets uniform over the vocabulary, the odd rows
    well predicted and one row in eight ignored (never all of them); drawn on `device`.

    Row 0 is never well predicted: a one-row shape's loss is then a few units, not the near-zero
    difference of two logsumexp-sized numbers, whose float32 rounding alone can pass the
    relative tolerance (2.5e-5 on one seed in CI, f54db1f). Its logits are shifted up by
    SHIFT."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rows, vocab = shape["rows"], shape["vocab"]
    logits = torch.randn(rows, vocab, generator=gen, device=device).mul_(LOGIT_SCALE)
    targets = torch.randint(0, vocab, (rows,), generator=gen, device=device)
    logits[torch.arange(1, rows, 2, device=device), targets[1::2]] += 6.0
    logits[0] += SHIFT
    targets[2::8] = IGNORE_INDEX
    return logits.to(getattr(torch, shape["dtype"])), targets


def reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Exact math; the harness calls it on a float64 copy of the logits."""
    x = logits.to(torch.float64)
    mx = x.amax(dim=-1, keepdim=True)
    lse = (mx + torch.log(torch.exp(x - mx).sum(dim=-1, keepdim=True))).squeeze(-1)
    valid = targets != IGNORE_INDEX
    picked = x.gather(1, torch.where(valid, targets, 0).unsqueeze(1)).squeeze(1)
    return torch.where(valid, lse - picked, torch.zeros_like(lse))


def output_dtypes(shape: dict) -> list[str]:
    """The loss is float32 whatever the logits' dtype."""
    return ["float32"]


def bytes_read(shape: dict) -> int:
    """The logits once, and the int64 targets."""
    itemsize = torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()
    return itemsize * shape["rows"] * shape["vocab"] + 8 * shape["rows"]


def bytes_written(shape: dict) -> int:
    """One float32 loss a row."""
    return 4 * shape["rows"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 4 * shape["rows"] * shape["vocab"]


def eager(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The usual training code: upcast the logits, then F.cross_entropy."""
    return torch.nn.functional.cross_entropy(
        logits.float(), targets, reduction="none", ignore_index=IGNORE_INDEX
    )


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False) or with symbolic shapes, as serving engines compile
# for varying batch sizes (True).
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": [
        "triton_cross_entropy.py",
        "cupy_cross_entropy_resident.py",
        "torch_cross_entropy.py",
    ],
    "cpu": ["torch_cross_entropy.py"],
}

FORBIDDEN_OPS = ("library-softmax", "cross_entropy", "nll_loss")

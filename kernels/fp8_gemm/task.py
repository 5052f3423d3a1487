"""fp8 GEMM with scales: y = dequant(a) @ dequant(w)^T, fp8 e4m3 operands, bfloat16 output.

Inputs `(a, a_scale, w, w_scale)`: a (m, k) and w (n, k) in float8_e4m3fn (w as nn.Linear
stores it); the scales float32, dequant(a)[i, j] = a[i, j] * a_scale[i // rows_a, j // cols_a]
where (rows_a, cols_a) = (m, k) / a_scale.shape, and the same for w. Two scalings, told apart by
the scales' shapes:
- per tensor (`scaling` "tensor"): both scales of shape (1, 1), as FP8 Llama checkpoints;
- blocks (`scaling` "block", DeepSeek-V3): a_scale (m, k / block) per token and block of k,
  w_scale (n / block, k / block) per block x block tile of the weight; block 128 on the GPU.
A shape's `dtype` is the operands' dtype; the output is bfloat16 (`output_dtypes`).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

# Relative error norm against the float64 product of the dequantised operands, picked by the
# output's dtype: bfloat16 output rounding (~2e-3) with fp32 accumulation.
TOLERANCE = {"bfloat16": 8e-3, "float32": 1e-5, "float64": 1e-12}

# (n, k) of FP8 checkpoints: Llama-3-8B/70B (per tensor) and DeepSeek-V3 (128 x 128 blocks).
_TENSOR_GPU = [(6144, 4096), (4096, 14336), (8192, 8192)]
_BLOCK_GPU = [(18432, 7168), (7168, 18432), (7168, 16384)]
_ROWS_GPU = [1, 16, 128, 1024, 4096]
_TENSOR_CPU = [(48, 64)]
_BLOCK_CPU = [(48, 64), (32, 96)]
_ROWS_CPU = [1, 5, 33]


def _class(m: int) -> str:
    return "decode" if m <= 16 else ("batch" if m <= 256 else "prefill")


def _shapes(rows: list[int], weights: dict[str, list[tuple[int, int]]], block: int) -> list[dict]:
    return [
        {
            "name": f"{scaling}-m{m}-n{n}-k{k}",
            "class": _class(m),
            "scaling": scaling,
            "m": m,
            "n": n,
            "k": k,
            "block": block,
            "dtype": "float8_e4m3fn",
            "out_dtype": "bfloat16",
            "weight": 2.0 if m <= 16 else 1.0,
        }
        for scaling, pairs in weights.items()
        for n, k in pairs
        for m in rows
    ]


SHAPES = {
    "cuda": _shapes(_ROWS_GPU, {"tensor": _TENSOR_GPU, "block": _BLOCK_GPU}, 128),
    "cpu": _shapes(_ROWS_CPU, {"tensor": _TENSOR_CPU, "block": _BLOCK_CPU}, 16),
}

BUCKET_KEY = "m"


def _scale_grid(shape: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (rows, cols) of each scale tile, for a and for w."""
    m, n, k, block = shape["m"], shape["n"], shape["k"], shape["block"]
    if shape["scaling"] == "tensor":
        return (m, k), (n, k)
    return (1, block), (block, block)


def _quantize(x: torch.Tensor, tile: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values and float32 scales of `x`, one scale per `tile` (amax / 448, as FP8 recipes)."""
    rows, cols = x.shape
    tr, tc = tile
    blocks = x.reshape(rows // tr, tr, cols // tc, tc)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).reshape(rows, cols).to(FP8)
    return q, scale.float().contiguous()


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """Activations ~ N(0, 1) and weights ~ N(0, 1/k), each tile of k columns (and, for w, of n
    rows) multiplied by a log-normal magnitude, so the scales differ a lot from tile to tile (as
    outlier channels make them) and a kernel applying the wrong scale is far off; outputs are of
    order one. Drawn on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    m, n, k, block = shape["m"], shape["n"], shape["k"], shape["block"]

    def draw(rows: int, spread_rows: int, scale: float) -> torch.Tensor:
        x = torch.randn(rows, k, generator=gen, device=device) * scale
        mag = torch.randn(rows // spread_rows, k // block, generator=gen, device=device)
        mag = mag.mul_(0.7).exp_().repeat_interleave(spread_rows, 0).repeat_interleave(block, 1)
        return x.mul_(mag)

    tile_a, tile_w = _scale_grid(shape)
    a, a_scale = _quantize(draw(m, 1, 1.0), tile_a)
    w, w_scale = _quantize(draw(n, block, k**-0.5), tile_w)
    return a, a_scale, w, w_scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q * its scale, in float64, the scales repeated over their tiles."""
    rows, cols = q.shape
    full = scale.to(torch.float64)
    full = full.repeat_interleave(rows // scale.shape[0], 0)
    full = full.repeat_interleave(cols // scale.shape[1], 1)
    return q.to(torch.float64) * full


def reference(a, a_scale, w, w_scale) -> torch.Tensor:
    """Exact math on the dequantised operands in float64."""
    return dequantize(a, a_scale) @ dequantize(w, w_scale).t()


def output_dtypes(shape: dict) -> list[str]:
    return [shape["out_dtype"]]


def _scale_count(shape: dict) -> int:
    (ar, ac), (wr, wc) = _scale_grid(shape)
    m, n, k = shape["m"], shape["n"], shape["k"]
    return (m // ar) * (k // ac) + (n // wr) * (k // wc)


def bytes_read(shape: dict) -> int:
    """Both fp8 operands once (the weight stream dominates at decode), and the scales."""
    return shape["k"] * (shape["m"] + shape["n"]) + 4 * _scale_count(shape)


def bytes_written(shape: dict) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, shape["out_dtype"])).element_size()
    return itemsize * shape["m"] * shape["n"]


def bytes_moved(shape: dict) -> int:
    return bytes_read(shape) + bytes_written(shape)


def flops(shape: dict) -> int:
    return 2 * shape["m"] * shape["n"] * shape["k"]


def eager(a, a_scale, w, w_scale) -> torch.Tensor:
    """The fallback of stacks without an fp8 GEMM: dequantise both operands to bfloat16, then
    F.linear."""

    def deq(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        rows, cols = q.shape
        full = scale.repeat_interleave(rows // scale.shape[0], 0)
        full = full.repeat_interleave(cols // scale.shape[1], 1)
        return (q.float() * full).to(torch.bfloat16)

    return torch.nn.functional.linear(deq(a, a_scale), deq(w, w_scale))


def scaled_mm(a, a_scale, w, w_scale) -> torch.Tensor:
    """The vendor path, torch._scaled_mm (cuBLASLt fp8): per-tensor scales as scalars; blocks as
    its (BlockWise1x128, BlockWise128x128) recipe, the activation scales outer-dim-major."""
    if a_scale.numel() == 1 and w_scale.numel() == 1:
        sa, sb = a_scale.reshape(()), w_scale.reshape(())
    else:
        sa, sb = a_scale.t().contiguous().t(), w_scale.t()
    return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


PEERS = {"eager": eager, "scaled-mm": scaled_mm}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic, i.e.
# specialised on every shape (False).
COMPILED_PEERS = {"torch.compile": False}

# torch._scaled_mm has CUDA kernels only (Hopper and later for fp8).
PEER_DEVICES = {"scaled-mm": ["cuda"]}

CANDIDATES = {
    "cuda": ["triton_fp8_gemm.py"],
    "cpu": ["torch_fp8_gemm.py"],
}

# Library ops that implement the task (dot products too, but for Triton's tl.dot: loop/guards.py).
FORBIDDEN_OPS = ("library-gemm",)

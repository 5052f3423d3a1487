"""Online softmax in Triton: one program per row, the row walked in BLOCK-wide chunks twice
(first a running max and sum, then the normalised write), autotuned over block and warps."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

__all__ = ["LANGUAGE", "PARAMS", "kernel"]

LANGUAGE = "triton"
PARAMS: dict[str, list] = {}

LOG2E: tl.constexpr = 1.4426950408889634


def _configs() -> list[triton.Config]:
    return [
        triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages)
        for block in (1024, 2048, 4096)
        for warps in (4, 8)
        for stages in (1, 2)
    ]


@triton.autotune(configs=_configs(), key=["n_cols"])
@triton.jit
def _softmax_online(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        x = tl.load(x_row + start + offs, mask=mask, other=float("-inf")).to(tl.float32) * LOG2E
        m_new = tl.maximum(m, x)
        s = s * tl.math.exp2(tl.where(m_new == float("-inf"), 0.0, m - m_new)) + tl.math.exp2(
            tl.where(mask, x - m_new, float("-inf"))
        )
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.math.exp2(m - row_max), axis=0)
    inv = 1.0 / total
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32) * LOG2E
        y = tl.math.exp2(x - row_max) * inv
        tl.store(y_ptr + row * stride_y + start + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def kernel(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D tensor."""
    assert x.dim() == 2, f"expected a 2-D tensor, got {x.dim()}-D"
    x = x if x.stride(-1) == 1 else x.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x) if out is None else out
    _softmax_online[(n_rows,)](x, y, n_cols, x.stride(0), y.stride(0))
    return y

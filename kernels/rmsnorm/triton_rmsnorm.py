"""RMSNorm in Triton: whole rows in registers, `rows_per_program` rows per program."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "num_warps": [1, 2, 4, 8, 16, 32],
    "rows_per_program": [1, 2, 4],
    "x_eviction": ["", "evict_first"],
}
EPS = 1e-6


@triton.jit
def _rmsnorm_rows(
    x_ptr, w_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y, eps,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    for r in range(ROWS):
        # The last program repeats the final row instead of masking rows: same values, no race.
        row = tl.minimum(pid * ROWS + r, n_rows - 1).to(tl.int64)
        x = tl.load(
            x_ptr + row * stride_x + cols, mask=col_mask, other=0.0, eviction_policy=EVICT
        ).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        y = x * inv * w
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)


def kernel(
    x: torch.Tensor,
    weight: torch.Tensor,
    num_warps: int = 8,
    rows_per_program: int = 1,
    x_eviction: str = "",
):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    grid = (triton.cdiv(n_rows, rows_per_program),)
    _rmsnorm_rows[grid](
        x, weight, y, n_rows, n_cols, x.stride(0), y.stride(0), EPS,
        BLOCK=block, ROWS=rows_per_program, EVICT=x_eviction, num_warps=num_warps,
    )  # fmt: skip
    return y

"""SwiGLU in Triton: a program takes `block` columns of `rows_per_program` rows, reads gate and up
once each, writes silu(gate) * up once; float32 arithmetic."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block": [512, 1024, 2048, 4096, 8192],
    "num_warps": [2, 4, 8, 16],
    "rows_per_program": [1, 2, 4],
    "load_eviction": ["", "evict_first"],
    "store_cache": ["", ".cs"],
}


@triton.jit
def _swiglu(
    x_ptr, y_ptr, n_rows, ffn, stride_x, stride_y,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ffn
    for r in range(ROWS):
        # The last program repeats the final row instead of masking rows: same values, no race.
        row = tl.minimum(tl.program_id(0) * ROWS + r, n_rows - 1).to(tl.int64)
        x_row = x_ptr + row * stride_x
        gate = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        up = tl.load(x_row + ffn + cols, mask=mask, other=0.0, eviction_policy=EVICT)
        y = gate * tl.sigmoid(gate) * up.to(tl.float32)
        tl.store(
            y_ptr + row * stride_y + cols,
            y.to(y_ptr.dtype.element_ty),
            mask=mask,
            cache_modifier=STORE,
        )


def kernel(
    x: torch.Tensor,
    block: int = 2048,
    num_warps: int = 4,
    rows_per_program: int = 1,
    load_eviction: str = "evict_first",
    store_cache: str = "",
) -> torch.Tensor:
    n_rows, width = x.shape
    ffn = width // 2
    y = torch.empty(n_rows, ffn, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n_rows, rows_per_program), triton.cdiv(ffn, block))
    _swiglu[grid](
        x, y, n_rows, ffn, x.stride(0), y.stride(0),
        BLOCK=block, ROWS=rows_per_program, EVICT=load_eviction, STORE=store_cache,
        num_warps=num_warps,
    )  # fmt: skip
    return y

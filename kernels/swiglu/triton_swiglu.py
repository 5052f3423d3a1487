"""SwiGLU in Triton: a program takes `block` columns of `rows_per_program` rows, reads gate and up
once each, writes silu(gate) * up once; float32 arithmetic. `order` is how programs are laid
out: "rows" (a column block of every row, then the next column block) or "memory" (a row's
column blocks one after another, the order the matrix lies in memory, as torch.compile's
flattened pointwise kernels walk it)."""

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
    "order": ["rows", "memory"],
}


@triton.jit
def _swiglu(
    x_ptr, y_ptr, n_rows, ffn, stride_x, stride_y, col_blocks,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr, STORE: tl.constexpr,
    MEMORY_ORDER: tl.constexpr,
):  # fmt: skip
    if MEMORY_ORDER:
        row_block = tl.program_id(0) // col_blocks
        col_block = tl.program_id(0) % col_blocks
    else:
        row_block = tl.program_id(0)
        col_block = tl.program_id(1)
    cols = col_block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ffn
    for r in range(ROWS):
        # The last program repeats the final row instead of masking rows: same values, no race.
        row = tl.minimum(row_block * ROWS + r, n_rows - 1).to(tl.int64)
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
    order: str = "rows",
) -> torch.Tensor:
    n_rows, width = x.shape
    ffn = width // 2
    y = torch.empty(n_rows, ffn, dtype=x.dtype, device=x.device)
    row_blocks, col_blocks = triton.cdiv(n_rows, rows_per_program), triton.cdiv(ffn, block)
    memory = order == "memory"
    grid = (row_blocks * col_blocks,) if memory else (row_blocks, col_blocks)
    _swiglu[grid](
        x, y, n_rows, ffn, x.stride(0), y.stride(0), col_blocks,
        BLOCK=block, ROWS=rows_per_program, EVICT=load_eviction, STORE=store_cache,
        MEMORY_ORDER=memory, num_warps=num_warps,
    )  # fmt: skip
    return y

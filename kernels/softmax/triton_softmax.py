"""Softmax over a vocabulary in Triton, three ways by shape:
- a row that fits in registers (next power of two <= `single_pass_max`): one read, one write;
- otherwise one program per row looping over column chunks: pass 1 keeps a running max and sum
  per lane (one exp per element: the lane whose max moves rescales by the same exp), pass 2
  re-reads the row (still in L2, loaded with `pass1_eviction`) and writes exp(x - max) / sum;
- fewer rows than `split_below`: each row split over several programs, partial (max, sum) per
  program combined by a second launch, so a decode batch still fills the GPU.
All arithmetic in float32 (base-2 exponentials), output in x's dtype.
"""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block": [2048, 4096, 8192, 16384],
    "num_warps": [4, 8, 16, 32],
    "num_stages": [1, 2, 3],
    "single_pass_max": [0, 16384, 32768],
    "row_warps": [8, 16, 32],
    "split_below": [0, 64, 512],
    "pass1_eviction": ["", "evict_last"],
    "pass2_eviction": ["", "evict_first"],
    "store_cache": ["", ".cs"],
}
# Programs a split row aims for across the GPU (a few waves of 132 SMs).
SPLIT_TARGET_PROGRAMS = 528


@triton.jit
def _stats(row_ptr, start, stop, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    """(max, sum of 2^(x*log2e - max)) over row[start:stop], in base-2 units."""
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -1e30, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for off in range(start, stop, BLOCK):
        idx = off + cols
        x = tl.load(row_ptr + idx, mask=idx < stop, other=-float("inf"), eviction_policy=EVICT)
        x = x.to(tl.float32) * 1.4426950408889634
        e = tl.exp2(-tl.abs(x - m))
        s = tl.where(x > m, s * e + 1.0, s + e)
        m = tl.maximum(m, x)
    mx = tl.max(m, axis=0)
    return mx, tl.sum(s * tl.exp2(m - mx), axis=0)


@triton.jit
def _write(
    row_ptr, out_ptr, start, stop, mx, inv,
    BLOCK: tl.constexpr, EVICT: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK)
    for off in range(start, stop, BLOCK):
        idx = off + cols
        mask = idx < stop
        x = tl.load(row_ptr + idx, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        y = tl.exp2(x * 1.4426950408889634 - mx) * inv
        tl.store(out_ptr + idx, y.to(out_ptr.dtype.element_ty), mask=mask, cache_modifier=STORE)


@triton.jit
def _softmax_looped(
    x_ptr, y_ptr, n_cols, stride_x, stride_y,
    BLOCK: tl.constexpr, EVICT1: tl.constexpr, EVICT2: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    mx, total = _stats(x_row, 0, n_cols, BLOCK, EVICT1)
    _write(x_row, y_ptr + row * stride_y, 0, n_cols, mx, 1.0 / total, BLOCK, EVICT2, STORE)


@triton.jit
def _softmax_whole(
    x_ptr, y_ptr, n_rows, n_cols, stride_x, stride_y,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    for r in range(ROWS):
        # The last program repeats the final row instead of masking rows: same values, no race.
        row = tl.minimum(pid * ROWS + r, n_rows - 1).to(tl.int64)
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
        x = x.to(tl.float32) * 1.4426950408889634
        e = tl.exp2(x - tl.max(x, axis=0))
        y = e * (1.0 / tl.sum(e, axis=0))
        tl.store(
            y_ptr + row * stride_y + cols,
            y.to(y_ptr.dtype.element_ty),
            mask=mask,
            cache_modifier=STORE,
        )


@triton.jit
def _split_stats(
    x_ptr, m_ptr, s_ptr, n_cols, stride_x, span, n_split,
    BLOCK: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    start = j * span
    stop = tl.minimum(start + span, n_cols)
    mx, total = _stats(x_ptr + row * stride_x, start, stop, BLOCK, EVICT)
    tl.store(m_ptr + row * n_split + j, mx)
    tl.store(s_ptr + row * n_split + j, total)


@triton.jit
def _split_write(
    x_ptr, y_ptr, m_ptr, s_ptr, n_cols, stride_x, stride_y, span, n_split,
    SPLIT: tl.constexpr, BLOCK: tl.constexpr, EVICT: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    k = tl.arange(0, SPLIT)
    ms = tl.load(m_ptr + row * n_split + k, mask=k < n_split, other=-1e30)
    ss = tl.load(s_ptr + row * n_split + k, mask=k < n_split, other=0.0)
    mx = tl.max(ms, axis=0)
    total = tl.sum(ss * tl.exp2(ms - mx), axis=0)
    start = j * span
    stop = tl.minimum(start + span, n_cols)
    _write(
        x_ptr + row * stride_x, y_ptr + row * stride_y, start, stop, mx, 1.0 / total,
        BLOCK, EVICT, STORE,
    )  # fmt: skip


def _split(x, y, block, num_warps, num_stages, evict1, evict2, store):
    n_rows, n_cols = x.shape
    chunks = triton.cdiv(n_cols, block)
    per_row = max(1, min(chunks, triton.cdiv(SPLIT_TARGET_PROGRAMS, n_rows)))
    span = triton.cdiv(chunks, per_row) * block
    n_split = triton.cdiv(n_cols, span)
    m = torch.empty(n_rows, n_split, dtype=torch.float32, device=x.device)
    s = torch.empty_like(m)
    grid = (n_rows, n_split)
    _split_stats[grid](
        x, m, s, n_cols, x.stride(0), span, n_split,
        BLOCK=block, EVICT=evict1, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    _split_write[grid](
        x, y, m, s, n_cols, x.stride(0), y.stride(0), span, n_split,
        SPLIT=triton.next_power_of_2(n_split), BLOCK=block, EVICT=evict2, STORE=store,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


def kernel(
    x: torch.Tensor,
    block: int = 8192,
    num_warps: int = 16,
    num_stages: int = 1,
    single_pass_max: int = 32768,
    row_warps: int = 32,
    split_below: int = 64,
    pass1_eviction: str = "evict_last",
    pass2_eviction: str = "evict_first",
    store_cache: str = "",
) -> torch.Tensor:
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    whole = triton.next_power_of_2(n_cols)
    if whole <= single_pass_max:
        _softmax_whole[(n_rows,)](
            x, y, n_rows, n_cols, x.stride(0), y.stride(0),
            BLOCK=whole, ROWS=1, STORE=store_cache, num_warps=row_warps,
        )  # fmt: skip
    elif n_rows < split_below:
        _split(x, y, block, num_warps, num_stages, pass1_eviction, pass2_eviction, store_cache)
    else:
        _softmax_looped[(n_rows,)](
            x, y, n_cols, x.stride(0), y.stride(0),
            BLOCK=block, EVICT1=pass1_eviction, EVICT2=pass2_eviction, STORE=store_cache,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
    return y

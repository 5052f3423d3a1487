"""Asking L2 for a weight ahead of the kernel that reads it, beside the kernels before it.

A decode block's attention reads its KV cache at about half the copy bandwidth (latency-bound:
few bytes, many small programs), and the output projection after it cannot start its arithmetic
before the attention ends. `start(w, first)` launches, on a side stream, one kernel that asks L2
(`cp.async.bulk.prefetch.L2`, one instruction a lane for 4 KiB) for w's bytes from the fraction
`first` of its storage to its end, and returns the function that joins that stream back. The
prefetch runs while the attention does, so the projection finds those lines in L2. On the H200
the prefetched lines survived a 16.8 MB cache read in session 21 (Llama's o weight, 33.5 MB:
17.6 us to 15.3-15.9 us with 16-32 MB of it prefetched, docs/benchmarks/2026-12-01-h200-session21.md).

A prefetch changes no value: it reads nothing into any program and writes nothing. Under a CUDA
graph capture the side stream becomes a branch of the graph that starts when the kernels before
the call have ended. Only CUDA tensors of devices of compute capability 9 and later are
prefetched; anything else gets a join that does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

LANE_BYTES = 4096  # what one bulk prefetch instruction asks for


@triton.jit
def _prefetch_l2(ptr, start, stop, LANE_BYTES: tl.constexpr):
    """One warp a program; lane i asks L2 for its LANE_BYTES from start (the last lane's
    request ends at stop; lanes past stop ask for nothing)."""
    lanes = tl.arange(0, 32).to(tl.int64)
    off = start + (tl.program_id(0).to(tl.int64) * 32 + lanes) * LANE_BYTES
    size = tl.minimum(stop - off, LANE_BYTES).to(tl.int32)
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\t"
        "@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;\n\t}",
        "=r,l,r",
        [ptr + off, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def _supported(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9


def byte_range(t: torch.Tensor, first: float) -> tuple[int, int]:
    """The bytes of t's storage asked for: from the fraction `first` (rounded down to 16 bytes)
    to the end of t's elements. t must be contiguous."""
    if not 0.0 <= first < 1.0:
        raise ValueError(f"first must be in [0, 1), got {first!r}")
    if not t.is_contiguous():
        raise ValueError("only a contiguous tensor's bytes are prefetched")
    n = t.numel() * t.element_size()
    return int(n * first) // 16 * 16, n


def start(t: torch.Tensor, first: float) -> Callable[[], None]:
    """Prefetch t's bytes from the fraction `first` on into L2, on a side stream that starts
    after the work queued so far on the current stream; returns the join (the current stream
    waits for the side stream), which must be called before a graph capture ends."""
    lo, hi = byte_range(t, first)
    if not _supported(t) or hi - lo < 16:
        return lambda: None
    main = torch.cuda.current_stream(t.device)
    side = _side_stream(t.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        grid = (triton.cdiv(hi - lo, 32 * LANE_BYTES),)
        _prefetch_l2[grid](t.view(-1).view(torch.uint8), lo, hi, LANE_BYTES=LANE_BYTES, num_warps=1)
    return lambda: main.wait_stream(side)

"""A GPU check that a kernel launched with programmatic dependent launch (PDL) waits for the
kernel before it: that kernel lets its dependents launch at once and writes the inputs only
after a delay. A control kernel that reads without waiting must see the stale inputs (else the
check proves nothing on this machine), and the kernel under test must see the new ones."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

BLOCK = 1024
SLEEP_NS = 50_000


@triton.jit
def _late_copy(src_ptr, dst_ptr, n, SLEEPS: tl.constexpr, BLOCK: tl.constexpr):
    """dst = src, written SLEEPS x 50 us after the kernel starts; dependents may launch at once."""
    tl.extra.cuda.gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for _ in tl.static_range(SLEEPS):
        # the sleep returns offs unchanged; the store's addresses depend on it, so it waits
        offs = tl.inline_asm_elementwise(
            "nanosleep.u32 50000;\n mov.b32 $0, $1;", "=r,r", [offs],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    ok = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok), mask=ok)


@triton.jit
def _copy_without_waiting(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok), mask=ok)


def write_late(src: torch.Tensor, dst: torch.Tensor, delay_us: int = 200) -> None:
    """Copy src into dst on the current stream about `delay_us` after the copy starts."""
    n = src.numel()
    grid = (triton.cdiv(n, BLOCK),)
    _late_copy[grid](src, dst, n, SLEEPS=max(1, delay_us * 1000 // SLEEP_NS), BLOCK=BLOCK)


def assert_waits_for_late_inputs(
    run: Callable[..., torch.Tensor], fresh: tuple[torch.Tensor, ...], want: torch.Tensor
) -> None:
    """`run(*inputs)`, launched right after kernels that write `fresh` into zeroed `inputs`
    late, gives `want` (to bfloat16 rounding); a copy launched the same way without waiting
    sees the zeros."""
    stale = tuple(torch.zeros_like(t) for t in fresh)
    for src, dst in zip(fresh, stale, strict=True):
        write_late(src, dst)
    seen = torch.empty_like(stale[-1])
    n = seen.numel()
    _copy_without_waiting[(triton.cdiv(n, BLOCK),)](
        stale[-1], seen, n, BLOCK=BLOCK, launch_pdl=True
    )
    torch.cuda.synchronize()
    assert not torch.equal(seen, fresh[-1]), "the no-wait control saw the late write: no overlap"
    stale = tuple(torch.zeros_like(t) for t in fresh)
    for src, dst in zip(fresh, stale, strict=True):
        write_late(src, dst)
    got = run(*stale)
    torch.cuda.synchronize()
    torch.testing.assert_close(got.double(), want.double(), atol=2e-2, rtol=2e-2)

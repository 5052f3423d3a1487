"""A GPU check that a kernel launched with programmatic dependent launch (PDL) waits for the
kernel before it: that kernel lets its dependents launch at once and writes one of the inputs
only after a delay of milliseconds. A control kernel that reads without waiting must see the
stale input (else the check proves nothing on this machine), and the kernel under test must see
the new one, for each input in turn. Everything is compiled before, so that the launches after
the late write take microseconds."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

THREADS = 128  # one element a thread in the late copy: one sleep a thread per round
SPAN = 1 << 16  # bytes a late-copy program writes
SLEEPS = 40  # rounds of 50 us: 2 ms


@triton.jit
def _late_copy(
    src_ptr, dst_ptr, n, SLEEPS: tl.constexpr, SPAN: tl.constexpr, THREADS: tl.constexpr
):
    """dst = src (bytes), written after SLEEPS x 50 us; the kernel after it may launch at once."""
    tl.extra.cuda.gdc_launch_dependents()
    lane = tl.arange(0, THREADS)
    t = lane
    for _ in tl.static_range(SLEEPS):
        # returns t unchanged; the copy's addresses depend on it, so the copy waits
        t = tl.inline_asm_elementwise(
            "nanosleep.u32 50000;\n mov.b32 $0, $1;", "=r,r", [t],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    base = tl.program_id(0).to(tl.int64) * SPAN + (t - lane)
    for off in range(0, SPAN, THREADS):
        idx = base + off + lane
        ok = idx < n
        tl.store(dst_ptr + idx, tl.load(src_ptr + idx, mask=ok), mask=ok)


@triton.jit
def _copy_without_waiting(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok), mask=ok)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def write_late(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy src into dst on the current stream about 2 ms after the copy starts."""
    s, d = _bytes(src), _bytes(dst)
    grid = (triton.cdiv(s.numel(), SPAN),)
    _late_copy[grid](s, d, s.numel(), SLEEPS=SLEEPS, SPAN=SPAN, THREADS=THREADS, num_warps=4)


def _read_without_waiting(src: torch.Tensor) -> torch.Tensor:
    """A copy of src by a kernel launched with PDL that does not wait."""
    s = _bytes(src)
    out = torch.empty_like(s)
    grid = (triton.cdiv(s.numel(), 1024),)
    _copy_without_waiting[grid](s, out, s.numel(), BLOCK=1024, launch_pdl=True)
    return out


def assert_waits_for_late_inputs(
    run: Callable[..., torch.Tensor],
    fresh: tuple[torch.Tensor, ...],
    want: torch.Tensor,
    stale: Callable[[torch.Tensor], torch.Tensor] = torch.zeros_like,
    exact: bool = False,
) -> None:
    """For each of `fresh` in turn, `run(*inputs)` launched right after a kernel that writes that
    input late over `stale(input)` (zeros unless told; the others as they are) gives `want` (to
    bfloat16 rounding, or bit for bit with `exact`), where a copy launched the same way without
    waiting sees the stale one."""
    scratch = torch.zeros_like(fresh[0])
    run(*fresh)
    write_late(fresh[0], scratch)
    _read_without_waiting(fresh[0])
    torch.cuda.synchronize()
    for i, src in enumerate(fresh):
        old = stale(src)
        write_late(src, old)
        seen = _read_without_waiting(old)
        torch.cuda.synchronize()
        assert not torch.equal(seen, _bytes(src)), f"input {i}: the no-wait control saw the write"
        old = stale(src)
        write_late(src, old)
        got = run(*fresh[:i], old, *fresh[i + 1 :])
        torch.cuda.synchronize()
        if exact:
            assert torch.equal(got, want), f"input {i} written late: not the same bits"
            continue
        torch.testing.assert_close(
            got.double(), want.double(), atol=2e-2, rtol=2e-2, msg=f"input {i} written late"
        )

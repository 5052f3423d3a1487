"""What an L2 prefetch of a weight saves the GEMV that reads it next, at the DeepSeek decode
block's sizes (batch 1): W_UV (128 heads of 512 x 128, 16.8 MB, a batched GEMV) and the o
projection (7168 x 16384, 235 MB, a GEMV). The question it answers: is it worth streaming the
next weights into L2 while the MLA attention, which uses a third of the read bandwidth for
about 28 us, runs?

For each weight and each prefetch size P (MB, the weight's first P MB), each repetition:
1. flushes L2 (writes a buffer larger than it);
2. asks L2 for the weight's first P MB (`cp.async.bulk.prefetch.L2`, one instruction per
   4 KiB, nothing read into registers), then lets a stand-in for the attention run:
   - `idle`: a one-SM spin of about 30 us;
   - `stream`: a read of 38 MB of other memory (the attention's cache at 32k), after the
     prefetch, so the prefetched lines must survive it;
3. times the GEMV alone between two events.
Prints the median of each (weight, P, stand-in) and writes them as JSON.

    python3 scripts/bench_l2_prefetch.py [--reps 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

LANE_BYTES = 4096  # bytes one bulk prefetch instruction asks for
MB = 1 << 20


@triton.jit
def _prefetch_l2(ptr, n_bytes, LANE_BYTES: tl.constexpr):
    """One warp a program, each lane asking L2 for its own LANE_BYTES (the last lanes past the
    end ask for the last 16 bytes again)."""
    lanes = tl.arange(0, 32).to(tl.int64)
    off = tl.minimum((tl.program_id(0).to(tl.int64) * 32 + lanes) * LANE_BYTES, n_bytes - 16)
    size = tl.minimum(n_bytes - off, LANE_BYTES).to(tl.int32)
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [ptr + off, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def prefetch(t: torch.Tensor, n_bytes: int) -> None:
    """Ask L2 for the first n_bytes (a multiple of 16) of t's storage."""
    if n_bytes > 0:
        grid = (triton.cdiv(n_bytes, 32 * LANE_BYTES),)
        _prefetch_l2[grid](t.view(torch.uint8), n_bytes, LANE_BYTES=LANE_BYTES, num_warps=1)


def median_us(run, setup, reps: int) -> float:
    """Median over reps of run() timed by events, setup() before each."""
    times = []
    for _ in range(reps):
        setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs an NVIDIA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    flush = torch.empty(256 * MB, dtype=torch.uint8, device=dev)
    cache = torch.randn(38 * MB // 2, generator=gen, device=dev).to(torch.bfloat16)
    sink = torch.empty((), device=dev, dtype=torch.float32)
    w_uv = torch.randn(128, 512, 128, generator=gen, device=dev).to(torch.bfloat16) * 0.05
    o_lat = torch.randn(128, 1, 512, generator=gen, device=dev).to(torch.bfloat16)
    w_o = torch.randn(7168, 16384, generator=gen, device=dev).to(torch.bfloat16) * 0.01
    x_o = torch.randn(1, 16384, generator=gen, device=dev).to(torch.bfloat16)
    cycles = int(torch.cuda.get_device_properties(dev).clock_rate * 1e3 * 30e-6)  # ~30 us
    weights = {
        "w_uv 16.8 MB (bmm)": (w_uv, lambda: torch.bmm(o_lat, w_uv), [0, 4, 8, 16.5]),
        "w_o 235 MB (linear)": (
            w_o,
            lambda: torch.nn.functional.linear(x_o, w_o),
            [0, 8, 16, 24, 32, 48],
        ),
    }
    for _, gemv, _ in weights.values():
        gemv()  # cuBLAS's heuristics and the kernels, before timing
    rows = []
    for name, (w, gemv, sizes) in weights.items():
        for mb in sizes:
            n_bytes = int(mb * MB) // 16 * 16
            for standin in ("idle", "stream"):

                def setup(w=w, n_bytes=n_bytes, standin=standin) -> None:
                    flush.fill_(1)
                    prefetch(w, n_bytes)
                    if standin == "idle":
                        torch.cuda._sleep(cycles)
                    else:
                        torch.sum(cache, dim=0, dtype=torch.float32, out=sink)

                us = median_us(gemv, setup, args.reps)
                rows.append({"weight": name, "prefetch_mb": mb, "standin": standin, "us": us})
                print(f"{name:22} prefetch {mb:5.1f} MB  {standin:6}  {us:7.2f} us", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"device": torch.cuda.get_device_name(dev), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What an L2 prefetch of a weight saves the GEMV that reads it next, at the decode blocks' sizes
(batch 1): DeepSeek's W_UV (128 heads of 512 x 128, 16.8 MB, a batched GEMV) and o projection
(7168 x 16384, 235 MB), Llama 8B's o projection (4096 x 4096, 33.5 MB). The question it
answers: is it worth streaming the next weight into L2 while the attention, which leaves most
of the read bandwidth unused, runs?

For each weight and each prefetch size P (MB, the weight's first P MB), each repetition:
1. flushes L2 (writes a buffer larger than it);
2. asks L2 for the weight's first P MB (`cp.async.bulk.prefetch.L2`, one instruction per
   4 KiB, nothing read into registers) around a stand-in for the attention:
   - `idle`: the prefetch, then a one-SM spin of about 30 us;
   - `stream`: the prefetch, then a read of the attention's cache (38 MB, DeepSeek's at 32k;
     16.8 MB, Llama's at 4k) from other memory, which the prefetched lines must survive;
   - `stream_evict_first`: the same read with an evict-first L2 policy;
   - `late`: the read first, then the prefetch and a spin of about 10 us;
3. after a spin of about 50 us that keeps the GPU busy while the host enqueues it (without it,
   a host slower than the stand-in leaves its launch gap between the events), times the GEMV
   alone between two events.
Prints the median of each (weight, P, stand-in) and writes them as JSON.

    python3 scripts/bench_l2_prefetch.py [--reps 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

LANE_BYTES = 4096  # bytes one bulk prefetch instruction asks for
READ_BLOCK = 4096  # elements a program of the cache read takes
MB = 1 << 20
STANDINS = ("idle", "stream", "stream_evict_first", "late")


@dataclass
class Case:
    """A weight, the GEMV that reads it, the prefetch sizes tried and the attention's cache."""

    name: str
    weight: torch.Tensor
    gemv: Callable[[], torch.Tensor]
    prefetch_mb: list[float]
    cache_mb: float


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


@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr):
    """A read of x (each program's sum kept, so the loads stay), evict-first in L2 or not."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVICT_FIRST:
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    else:
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(v.to(tl.float32)))


def read(x: torch.Tensor, sums: torch.Tensor, evict_first: bool) -> None:
    """Read all of x (1-D) once."""
    grid = (triton.cdiv(x.numel(), READ_BLOCK),)
    _read[grid](x, sums, x.numel(), BLOCK=READ_BLOCK, EVICT_FIRST=evict_first)


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

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(torch.bfloat16)

    flush = torch.empty(256 * MB, dtype=torch.uint8, device=dev)
    cache = randn(38 * MB // 2)
    sums = torch.empty(triton.cdiv(cache.numel(), READ_BLOCK), device=dev)
    w_uv, o_lat = randn(128, 512, 128, scale=0.05), randn(128, 1, 512)
    w_o, x_o = randn(7168, 16384, scale=0.01), randn(1, 16384)
    w_lo, x_lo = randn(4096, 4096, scale=0.02), randn(1, 4096)
    linear = torch.nn.functional.linear
    cases = [
        Case("w_uv 16.8 MB (bmm)", w_uv, lambda: torch.bmm(o_lat, w_uv), [0, 4, 8, 16.5], 38),
        Case("w_o 235 MB (linear)", w_o, lambda: linear(x_o, w_o), [0, 8, 16, 24, 32, 48], 38),
        Case("llama w_o 33.5 MB", w_lo, lambda: linear(x_lo, w_lo), [0, 8, 16, 24, 32], 16.8),
    ]
    clock_hz = torch.cuda.get_device_properties(dev).clock_rate * 1e3
    for case in cases:
        case.gemv()  # cuBLAS's heuristics and the kernels, before timing
    rows = []
    for case in cases:
        part = cache[: int(case.cache_mb * MB) // 2]
        for mb in case.prefetch_mb:
            n_bytes = int(mb * MB) // 16 * 16
            for standin in STANDINS:

                def setup(w=case.weight, n_bytes=n_bytes, standin=standin, part=part) -> None:
                    flush.fill_(1)
                    if standin == "late":
                        read(part, sums, evict_first=False)
                    prefetch(w, n_bytes)
                    if standin in ("idle", "late"):
                        torch.cuda._sleep(int(clock_hz * (30e-6 if standin == "idle" else 10e-6)))
                    else:
                        read(part, sums, evict_first=standin == "stream_evict_first")
                    # The GPU kept busy while the timed GEMV and its events are enqueued, so
                    # no launch gap of the host's falls between the events.
                    torch.cuda._sleep(int(clock_hz * 50e-6))

                us = median_us(case.gemv, setup, args.reps)
                rows.append({"weight": case.name, "prefetch_mb": mb, "cache_mb": case.cache_mb,
                             "standin": standin, "us": us})  # fmt: skip
                print(
                    f"{case.name:22} prefetch {mb:5.1f} MB  {standin:18}  {us:7.2f} us", flush=True
                )
    if args.json:
        args.json.write_text(
            json.dumps({"device": torch.cuda.get_device_name(dev), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

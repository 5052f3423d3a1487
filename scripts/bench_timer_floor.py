"""The harness's floor: what the timer measures for a kernel that does nothing, and for kernels
that only read (or copy) the bytes the decode shapes move.

Every sample is one CUDA-graph replay between two CUDA events with the L2 flushed before it
(baselines.timer), so each time includes the graph launch and the events as well as the kernel.
At decode shapes that fixed part is most of the time, and it bounds the ratio any kernel can
reach: a candidate that reads its bytes as fast as `read_all` here, against a peer at P us,
gets at most P / (this row's time).

    uv run python scripts/bench_timer_floor.py --json floor.json [--sizes-mb 4.1,16.4,33.6]

GPU only. The read kernel issues all of a thread's 16-byte loads at once over a grid that
covers the buffer in one pass, and writes nothing (unless the data's XOR hits one constant);
the same kernel in clusters of 8 blocks shows what clusters cost, and the copy (every vector
stored back elsewhere) bounds the softmax, which writes what it reads. A copy row's % of copy
counts the bytes read and written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from baselines.roofline import (
    READ_SOURCE,
    READ_VECTORS_PER_THREAD,
    TorchStream,
    device_copy_bandwidth,
    random_words,
    read_launcher,
)
from baselines.stats import summarize
from baselines.timer import GpuTimer

# The bytes of: softmax / cross-entropy decode-64x32000 and 64x128256 (bf16 logits), the
# 4096 x 4096 and 6144 x 4096 bf16 weights (M = 1 GEMV), and 1 GiB for the ceiling.
DEFAULT_SIZES_MB = [4.096, 16.417, 33.554, 50.332, 1073.742]
# Besides the read kernel of baselines.roofline (which also copies, given a destination): a
# kernel that does nothing, and the read in clusters of 8 blocks that meet at one cluster
# barrier before they leave, as the row-resident softmax and cross-entropy kernels do.
SOURCE = (
    READ_SOURCE
    + r"""
extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void __cluster_dims__(8, 1, 1) read_all_cluster8(
    const uint4* __restrict__ src, long long n16, unsigned* __restrict__ out,
    uint4* __restrict__ dst) {
    read_slice(src, n16, out, dst);
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
"""
)


@dataclass(frozen=True)
class FloorRow:
    name: str
    bytes_moved: int
    us: float
    us_lo: float
    us_hi: float
    bytes_per_s: float | None
    pct_of_copy: float | None


def floor_row(name: str, nbytes: int, samples_s: list[float], copy_bps: float) -> FloorRow:
    """One row: the samples' median (with its bootstrap interval) and, for a read or a copy, the bytes
    per second it implies and that as a % of the device's copy bandwidth."""
    s = summarize(samples_s)
    bps = nbytes / s.median if nbytes else None
    return FloorRow(
        name=name,
        bytes_moved=nbytes,
        us=s.median * 1e6,
        us_lo=s.ci_low * 1e6,
        us_hi=s.ci_high * 1e6,
        bytes_per_s=bps,
        pct_of_copy=100 * bps / copy_bps if bps else None,
    )


def _launchers(sizes_bytes: list[int], device: torch.device) -> dict:
    import cupy

    module = cupy.RawModule(code=SOURCE, options=(f"-DVPT={READ_VECTORS_PER_THREAD}",))
    empty = module.get_function("empty_kernel")
    read = module.get_function("read_all")
    read8 = module.get_function("read_all_cluster8")

    def launch_empty() -> None:
        empty((1,), (32,), (), stream=TorchStream(torch.cuda.current_stream(device).cuda_stream))

    out = {"empty kernel": (0, launch_empty)}
    for nbytes in sizes_bytes:
        src = random_words(nbytes, device)
        read_bytes = src.numel() * 4
        mb = f"{nbytes / 1e6:.1f} MB"
        out[f"read {mb}"] = (read_bytes, read_launcher(read, src))
        out[f"read {mb}, clusters of 8"] = (read_bytes, read_launcher(read8, src, cluster=8))
        out[f"copy {mb}"] = (2 * read_bytes, read_launcher(read, src, torch.empty_like(src)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default=",".join(map(str, DEFAULT_SIZES_MB)))
    parser.add_argument("--blocks", type=int, default=10, help="blocks of samples per kernel")
    parser.add_argument("--samples", type=int, default=20, help="samples per block")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_timer_floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    timer = GpuTimer(device)
    copy_bps = device_copy_bandwidth(timer)
    sizes = [int(float(mb) * 1e6) for mb in args.sizes_mb.split(",") if mb]
    rows = []
    for name, (nbytes, launch) in _launchers(sizes, device).items():
        graph, _ = timer.capture(launch)
        start = time.perf_counter()
        while time.perf_counter() - start < 0.2:
            timer.block(graph, args.samples)
        samples = [t for _ in range(args.blocks) for t in timer.block(graph, args.samples)]
        row = floor_row(name, nbytes, samples, copy_bps)
        rows.append(row)
        pct = f"  {row.pct_of_copy:5.1f} % of copy" if row.pct_of_copy else ""
        print(f"{name:>18}: {row.us:8.2f} us [{row.us_lo:.2f}, {row.us_hi:.2f}]{pct}")
    print(f"copy bandwidth {copy_bps / 1e12:.2f} TB/s ({torch.cuda.get_device_name(device)})")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name(device),
                    "copy_bytes_per_s": copy_bps,
                    "rows": [asdict(r) for r in rows],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

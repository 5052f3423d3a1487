"""Ceilings a kernel cannot beat: measured copy and read bandwidth, and the floor they imply for
a time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from baselines.timer import GpuTimer, median

SLACK = 1.05


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float | None
    flops_per_s: float | None

    def floor_s(self, bytes_moved: int, flops: int) -> float:
        """The least time the hardware allows (0 when no ceiling is known)."""
        floors = [0.0]
        if self.copy_bytes_per_s:
            floors.append(bytes_moved / (self.copy_bytes_per_s * SLACK))
        if self.flops_per_s:
            floors.append(flops / (self.flops_per_s * SLACK))
        return max(floors)


def kernel_copy(nbytes: int, device: torch.device | str) -> Callable[[], torch.Tensor]:
    """A device-to-device copy of `nbytes` of random data done by an SM kernel (x * 1). Captured
    in a CUDA graph, a plain `copy_` of 512 MiB or more becomes a copy-engine memcpy node, 2.7
    TB/s on an H200 against 4.2 by kernel (2026-11-29), and kernels are what it is compared with."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return lambda: torch.mul(src, 1.0, out=dst)


def device_copy_bandwidth(
    timer: GpuTimer, nbytes: int = 1 << 30, samples: int = 10, warm_s: float = 0.3
) -> float:
    """Read+write bytes per second of `kernel_copy`, best block median of graph replays."""
    return (
        2
        * (nbytes // 4 * 4)
        / _best_block_median(timer, kernel_copy(nbytes, timer.device), samples, warm_s)
    )


def _best_block_median(timer: GpuTimer, fn: Callable, samples: int, warm_s: float) -> float:
    """The best of five block medians of `fn`'s graph, replayed for `warm_s` first: an idle GPU
    sits at its lowest clocks, and a ceiling that reads low would reject honest kernels as
    impossible. `fn` (and the buffers it holds) lives until the graph has been timed."""
    graph, _ = timer.capture(fn)
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        timer.block(graph, samples)
    return min(median(timer.block(graph, samples)) for _ in range(5))


# The read kernel: each thread issues VECTORS_PER_THREAD 16-byte loads at once, over a grid that
# covers the buffer in one pass, and XORs them into a value it writes only if it hits one
# constant (so the loads stay). With `dst` it stores each vector there instead (a copy).
READ_THREADS = 512
READ_VECTORS_PER_THREAD = 4
READ_SOURCE = r"""
__device__ __forceinline__ void read_slice(const uint4* __restrict__ src, long long n16,
                                           unsigned* __restrict__ out, uint4* __restrict__ dst) {
    const long long first = (long long)blockIdx.x * blockDim.x * VPT + threadIdx.x;
    uint4 v[VPT];
    #pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const long long k = first + (long long)j * blockDim.x;
        v[j] = k < n16 ? __ldcs(src + k) : make_uint4(0u, 0u, 0u, 0u);
    }
    if (dst != nullptr) {
        #pragma unroll
        for (int j = 0; j < VPT; ++j) {
            const long long k = first + (long long)j * blockDim.x;
            if (k < n16) __stcs(dst + k, v[j]);
        }
        return;
    }
    unsigned x = 0u;
    #pragma unroll
    for (int j = 0; j < VPT; ++j) x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    if (x == 0x9e3779b9u) out[0] = x;
}

extern "C" __global__ void read_all(const uint4* __restrict__ src, long long n16,
                                    unsigned* __restrict__ out, uint4* __restrict__ dst) {
    read_slice(src, n16, out, dst);
}
"""


@dataclass(frozen=True)
class TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


def read_launcher(
    kernel,
    src: torch.Tensor,
    dst: torch.Tensor | None = None,
    cluster: int = 1,
    sink: torch.Tensor | None = None,
) -> Callable[[], None]:
    """A call of a `read_all`-shaped CuPy `kernel` over `src` (a read; with `dst`, a copy into
    it) on torch's current stream, the grid rounded up to whole clusters of `cluster` blocks.
    `sink` (one int32) takes what a read writes, if anything. The call holds the tensors it
    reads and writes."""
    import cupy

    n16 = src.numel() * src.element_size() // 16
    blocks = -(-n16 // (READ_THREADS * READ_VECTORS_PER_THREAD))
    grid = -(-blocks // cluster) * cluster
    if sink is None:
        sink = torch.zeros(1, dtype=torch.int32, device=src.device)
    held = (src, dst, sink)
    target = 0 if dst is None else dst.data_ptr()
    args = (src.data_ptr(), cupy.int64(n16), sink.data_ptr(), cupy.uint64(target))

    def launch() -> None:
        stream = TorchStream(torch.cuda.current_stream(src.device).cuda_stream)
        kernel((grid,), (READ_THREADS,), args, stream=stream)

    launch.holds = held  # the tensors behind `args` live as long as the call
    return launch


def random_words(nbytes: int, device: torch.device | str) -> torch.Tensor:
    """Random int32 words filling the whole 16-byte vectors in `nbytes` (what the read kernel
    reads: random, so no compression or constant-XOR shortcut applies)."""
    return torch.randint(-(2**31), 2**31 - 1, (nbytes // 16 * 4,), dtype=torch.int32, device=device)


def kernel_read(nbytes: int, device: torch.device | str) -> Callable[[], None]:
    """A read of `nbytes` of random data by an SM kernel that writes nothing (READ_SOURCE). On the
    H200 it reads 1 GiB at 4.54-4.62 TB/s, above the 4.27 TB/s of copy. torch.sum over rows of 64 KiB,
    the read kernel until session 9, read at 4.10 TB/s, and the floor that set for read-mostly
    tasks rejected an honest cross-entropy kernel as faster than physics
    (docs/benchmarks/2026-11-30-h200-session9.md)."""
    import cupy

    if nbytes < 16:
        raise ValueError(f"kernel_read reads whole 16-byte vectors, got {nbytes} bytes")
    device = torch.device(device)
    src = random_words(nbytes, device)
    with cupy.cuda.Device(device.index):
        module = cupy.RawModule(code=READ_SOURCE, options=(f"-DVPT={READ_VECTORS_PER_THREAD}",))
        return read_launcher(module.get_function("read_all"), src)


def device_read_bandwidth(
    timer: GpuTimer, nbytes: int = 1 << 30, samples: int = 10, warm_s: float = 0.3
) -> float:
    """Bytes read per second of `kernel_read`, best block median of graph replays: the ceiling
    for kernels that mostly read (above copy bandwidth on HBM, which turns reads into writes)."""
    return (
        nbytes
        // 16
        * 16
        / _best_block_median(timer, kernel_read(nbytes, timer.device), samples, warm_s)
    )

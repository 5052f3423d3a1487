"""Ceilings a kernel cannot beat: measured copy bandwidth, and the floor it implies for a time."""

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
    graph, _ = timer.capture(kernel_copy(nbytes, timer.device))
    # An idle GPU sits at its lowest clocks: replay until it has ramped up, then keep the best
    # block, since a ceiling that reads low would reject honest kernels as impossible.
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        timer.block(graph, samples)
    best = min(median(timer.block(graph, samples)) for _ in range(5))
    return 2 * (nbytes // 4 * 4) / best


def kernel_read(nbytes: int, device: torch.device | str) -> Callable[[], torch.Tensor]:
    """A read of `nbytes` of random data by an SM kernel that writes almost nothing: a sum over
    rows of 64 KiB, one float per row."""
    rows = max(1, nbytes // (1 << 16))
    src = torch.empty(rows, (1 << 16) // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty(rows, dtype=torch.float32, device=device)
    return lambda: torch.sum(src, dim=1, out=dst)


def device_read_bandwidth(
    timer: GpuTimer, nbytes: int = 1 << 30, samples: int = 10, warm_s: float = 0.3
) -> float:
    """Bytes read per second of `kernel_read`, best block median of graph replays: the ceiling
    for kernels that mostly read (above copy bandwidth on HBM, which turns reads into writes)."""
    graph, _ = timer.capture(kernel_read(nbytes, timer.device))
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        timer.block(graph, samples)
    best = min(median(timer.block(graph, samples)) for _ in range(5))
    rows = max(1, nbytes // (1 << 16))
    return rows * (1 << 16) / best

"""Ceilings a kernel cannot beat: measured copy bandwidth, and the floor it implies for a time."""

from __future__ import annotations

import time
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


def device_copy_bandwidth(
    timer: GpuTimer, nbytes: int = 1 << 30, samples: int = 10, warm_s: float = 0.3
) -> float:
    """Read+write bytes per second of a device-to-device copy done by a kernel, median of graph
    replays. (A captured `copy_` of this size becomes a copy-engine memcpy node, which runs at
    about two thirds of what SM loads and stores reach, so it would understate the ceiling.)"""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=timer.device).uniform_()
    dst = torch.empty_like(src)
    graph, _ = timer.capture(lambda: torch.mul(src, 1.0, out=dst))
    # An idle GPU sits at its lowest clocks: replay until it has ramped up, then keep the best
    # block, since a ceiling that reads low would reject honest kernels as impossible.
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        timer.block(graph, samples)
    best = min(median(timer.block(graph, samples)) for _ in range(5))
    return 2 * src.numel() * 4 / best

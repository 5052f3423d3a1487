"""Ceilings a kernel cannot beat: measured copy bandwidth, and the floor it implies for a time."""

from __future__ import annotations

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


def device_copy_bandwidth(timer: GpuTimer, nbytes: int = 1 << 30, samples: int = 20) -> float:
    """Read+write bytes per second of a device-to-device copy, median of graph replays."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=timer.device).uniform_()
    dst = torch.empty_like(src)
    graph, _ = timer.capture(lambda: dst.copy_(src))
    timer.block(graph, 3)
    return 2 * src.numel() * 4 / median(timer.block(graph, samples))

"""Where a CUDA graph's replay spends its time: each kernel's duration and the idle gap before
it, from the profiler's device timeline over several replays.

A decode step is a chain of a dozen kernels, and a chain's time is more than the sum of its
kernels: each one waits for the one before to drain, then ramps up. `kernel_timeline` says how
much of a replay is kernels and how much is the gaps between them, kernel by kernel. Every
device activity counts as a kernel (a memset or copy node too), and the graph is taken to run on
one stream: kernels that overlap show negative gaps.

Kernels launched with programmatic dependent launch do overlap: each starts while the one before
drains and waits inside (`griddepcontrol.wait`), so its duration counts that wait too. What a
kernel costs the chain is then its *advance*, from its start to the next kernel's start (its
duration, for the last); the advances add up to the span.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KernelSpan:
    """One kernel of one replay on the device clock, in microseconds."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class KernelStep:
    """A kernel's place in the replay, with medians over the replays."""

    position: int
    name: str
    duration_us: float
    gap_before_us: float  # from the end of the kernel before (0 for the first)
    advance_us: float  # from its start to the next kernel's start (its duration, for the last)


@dataclass(frozen=True)
class Timeline:
    """The median replay: its kernels in order, the first start to the last end, and how much
    of that the kernels ran."""

    steps: list[KernelStep]
    replays: int
    span_us: float
    busy_us: float

    @property
    def gaps_us(self) -> float:
        return self.span_us - self.busy_us

    def to_dict(self) -> dict:
        return {
            "replays": self.replays,
            "span_us": self.span_us,
            "busy_us": self.busy_us,
            "gaps_us": self.gaps_us,
            "kernels": [vars(s) for s in self.steps],
        }


def summarize_replays(spans: list[KernelSpan], replays: int) -> Timeline:
    """Cut the time-ordered kernels of `replays` identical replays into replays and take the
    median of each position's duration and gap. Refuses a count that does not divide evenly or
    replays whose kernels differ (another stream's work in the trace)."""
    if replays < 1:
        raise ValueError(f"replays must be at least 1, got {replays}")
    ordered = sorted(spans, key=lambda s: s.start_us)
    if not ordered or len(ordered) % replays:
        raise ValueError(f"{len(ordered)} kernels do not split into {replays} equal replays")
    per = len(ordered) // replays
    runs = [ordered[i * per : (i + 1) * per] for i in range(replays)]
    names = [s.name for s in runs[0]]
    for i, run in enumerate(runs[1:], start=1):
        if [s.name for s in run] != names:
            raise ValueError(f"replay {i} ran other kernels than replay 0")
    steps = []
    for p in range(per):
        durations = [run[p].end_us - run[p].start_us for run in runs]
        gaps = [0.0 if p == 0 else run[p].start_us - run[p - 1].end_us for run in runs]
        ends = [run[p + 1].start_us if p + 1 < per else run[p].end_us for run in runs]
        advances = [end - run[p].start_us for end, run in zip(ends, runs, strict=True)]
        steps.append(
            KernelStep(
                p,
                names[p],
                statistics.median(durations),
                statistics.median(gaps),
                statistics.median(advances),
            )
        )
    span = statistics.median(run[-1].end_us - run[0].start_us for run in runs)
    busy = statistics.median(sum(s.end_us - s.start_us for s in run) for run in runs)
    return Timeline(steps, replays, span, busy)


def kernel_timeline(graph: torch.cuda.CUDAGraph, replays: int = 20) -> Timeline:
    """Replay `graph` under the profiler (after warm replays) and summarize its kernels."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    spans = [
        KernelSpan(e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    return summarize_replays(spans, replays)


def format_timeline(timeline: Timeline, width: int = 60) -> str:
    """A table: position, duration, gap before, advance, kernel name (cut to `width`)."""
    lines = [f"{'#':>3} {'us':>8} {'gap':>7} {'advance':>8}  kernel"]
    for s in timeline.steps:
        lines.append(
            f"{s.position:>3} {s.duration_us:8.2f} {s.gap_before_us:7.2f} {s.advance_us:8.2f}"
            f"  {s.name[:width]}"
        )
    lines.append(
        f"span {timeline.span_us:.2f} us: kernels {timeline.busy_us:.2f}, "
        f"gaps {timeline.gaps_us:.2f} ({len(timeline.steps)} kernels)"
    )
    return "\n".join(lines)

"""The one way to time a kernel.

GPU: CUDA events around CUDA-graph replays on the harness's stream, the L2 cache flushed (and the
persisting-L2 window reset) before every sample. CPU: the monotonic host clock. Both run in
blocks; `run_interleaved` alternates runners block by block (ABAB...) until a stopping rule holds.

The clock and event functions are bound when this module is imported, which the worker does
before any candidate loads; `tampered()` says whether anything was patched since.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from baselines.stats import summarize

_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_graph_replay = torch.cuda.CUDAGraph.replay
_BOUND = {
    (time, "perf_counter"): _perf_counter,
    (torch.cuda, "Event"): _Event,
    (torch.cuda, "synchronize"): _synchronize,
    (torch.cuda.CUDAGraph, "replay"): _graph_replay,
}


class CaptureError(Exception):
    """A callable that cannot be captured into a CUDA graph."""


@dataclass
class StoppingRule:
    """Blocks of `samples_per_block` samples; stop once at least `min_blocks` and `min_time_s`
    are done and every runner's median is known to `rel_halfwidth`, or at a maximum."""

    samples_per_block: int = 10
    min_blocks: int = 5
    max_blocks: int = 40
    min_time_s: float = 0.0
    max_time_s: float = 1.0
    rel_halfwidth: float = 0.005
    warmup: int = 3


_OWN_IDS = {
    name: id(globals()[name])
    for name in ("_perf_counter", "_Event", "_synchronize", "_graph_replay")
}


def tampered() -> list[str]:
    """Names of the timing functions that no longer are what they were at import: the library
    attributes and this module's own bound copies."""
    changed = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for (owner, name), bound in _BOUND.items()
        if getattr(owner, name, None) is not bound
    ]
    mine = globals()
    changed += [
        f"{__name__}.{name}" for name, ident in _OWN_IDS.items() if id(mine.get(name)) != ident
    ]
    return changed


def _load_cudart() -> ctypes.CDLL | None:
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class GpuTimer:
    """Times captured CUDA graphs on the current stream, with the L2 flushed between samples."""

    def __init__(self, device: torch.device | str = "cuda", flush_l2: bool = True) -> None:
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.flush_l2 = flush_l2
        self._flush = torch.empty(2 * l2, dtype=torch.uint8, device=self.device)
        self._cudart = _load_cudart()

    def reset_persisting_l2(self) -> bool:
        if self._cudart is None:
            return False
        return self._cudart.cudaCtxResetPersistingL2Cache() == 0

    def capture(self, fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
        """Warm `fn` up on a side stream, then capture one call; returns the graph and its output."""
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            _synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            # A private pool per graph: a pool shared by graphs that are later freed can trip
            # torch's allocator (use_count assert) on the next capture.
            with torch.cuda.graph(graph):
                out = fn()
            _synchronize(self.device)
        except Exception as exc:
            raise CaptureError(f"{type(exc).__name__}: {exc}") from exc
        return graph, out

    def block(self, graph: torch.cuda.CUDAGraph, n: int) -> list[float]:
        """n samples of one replay each, in seconds."""
        starts = [_Event(enable_timing=True) for _ in range(n)]
        ends = [_Event(enable_timing=True) for _ in range(n)]
        self.reset_persisting_l2()
        for i in range(n):
            if self.flush_l2:
                self._flush.zero_()
            starts[i].record()
            _graph_replay(graph)
            ends[i].record()
        _synchronize(self.device)
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]


def cpu_block(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = _perf_counter()
        fn()
        out.append(_perf_counter() - t0)
    return out


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def run_interleaved(
    runners: list[Callable[[int], list[float]]],
    rule: StoppingRule | None = None,
    on_block: Callable[[int, int, list[float]], bool] | None = None,
) -> list[list[float]]:
    """Run each runner's block in turn (ABAB...) and return each runner's block medians.

    `on_block(runner_index, block_index, samples)` may return False to have that block measured
    again (a throttled block, say); a block is retried at most twice.
    """
    rule = rule or StoppingRule()
    for run in runners:
        run(rule.warmup)
    medians: list[list[float]] = [[] for _ in runners]
    t0 = _perf_counter()
    order = list(range(len(runners)))
    while True:
        # ABBA: alternate the order every round so no runner always follows the same neighbour.
        for i in order if len(medians[0]) % 2 == 0 else order[::-1]:
            run = runners[i]
            for _attempt in range(3):
                samples = run(rule.samples_per_block)
                if on_block is None or on_block(i, len(medians[i]), samples):
                    break
            medians[i].append(median(samples))
        blocks = len(medians[0])
        elapsed = _perf_counter() - t0
        if blocks >= rule.max_blocks or elapsed >= rule.max_time_s:
            break
        if blocks >= rule.min_blocks and elapsed >= rule.min_time_s:
            widths = [summarize(m, n_boot=200).rel_halfwidth for m in medians]
            if max(widths) <= rule.rel_halfwidth:
                break
    return medians

"""The one way to time a kernel.

GPU: CUDA events around CUDA-graph replays on the harness's stream, the L2 cache flushed (and the
persisting-L2 window reset) before every sample. CPU: the monotonic host clock. Both run in
blocks; `run_interleaved` alternates runners block by block (ABBA...) until a stopping rule holds.

The L2 flush reads a buffer twice the size of the L2 by default (`flush="read"`): afterwards the
cache holds only clean lines of that buffer, so the timed kernel starts cold and writes back
nothing of anyone else's. Zeroing the buffer (`flush="write"`, the old way and nvbench's and
Triton's) leaves up to an L2 of dirty lines that the timed kernel pays to write back, a fixed
cost that dilutes real differences. docs/measurement.md has the reasoning and the measurements.

The clock and event functions are bound when this module is imported, which the worker does
before any candidate loads; `tampered()` says whether anything was patched since.
"""

from __future__ import annotations

import ctypes
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from baselines.stats import paired_ratio_halfwidth, summarize

# Drawn from the OS on every call: a forked process (the evaluator's children) inherits no state,
# so no two measurements share an order and nobody can predict one.
_SHUFFLE = random.SystemRandom()
# Captures of one kernel, one replayed per block in turn: each capture's outputs land somewhere
# else in memory, and on the H200 two captures of one kernel differed by up to 0.3 % (2 % at
# microsecond shapes) for as long as they lived; rotating captures averages that out. Eight, not
# four: a 1 % slowdown was detected in 100 of 100 decisions with eight and 93 of 100 with four in
# one session on the H200 (docs/benchmarks/2026-11-29-h200-session5.md).
CAPTURE_SLOTS = 8

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

FLUSH_MODES = ("read", "write", "write_read", "none")
STOP_ON = ("ratio", "each")
_CHECK_GROWTH = 1.15  # after min_blocks, the precision is checked when blocks grew by 15 %


class CaptureError(Exception):
    """A callable that cannot be captured into a CUDA graph."""


@dataclass
class StoppingRule:
    """When `run_interleaved` stops.

    Blocks of `samples_per_block` samples (raised so that a block's measured time is at least
    `min_block_s`, up to `max_samples_per_block`; `min_block_s=0` keeps it fixed). Stop once at
    least `min_blocks` and `min_time_s` are done and the precision target holds, or at
    `max_blocks`, or at `max_time_s` once `min_blocks` are done. Precision: with `stop_on="ratio"` and two or more runners, the
    paired bootstrap interval of every runner's ratio of medians to runner 0 has a relative
    half-width of at most `ratio_halfwidth` (blocks are paired because they are interleaved);
    with `stop_on="each"` or one runner, every runner's median is known to `rel_halfwidth`.
    `warmup` samples (and at least `warmup_s` seconds of them) run before anything counts.
    Runners share the block size the fastest one needs, except that no runner's block is made
    longer than `max_block_s` for it (a runner that looks fast in its warm-up cannot stretch a
    slow rival's blocks until the measurement runs out of time)."""

    samples_per_block: int = 10
    min_blocks: int = 10
    max_blocks: int = 200
    min_time_s: float = 0.0
    max_time_s: float = 0.4
    rel_halfwidth: float = 0.005
    warmup: int = 3
    stop_on: str = "ratio"
    ratio_halfwidth: float = 0.001
    min_block_s: float = 0.001
    max_samples_per_block: int = 1000
    warmup_s: float = 0.0
    max_block_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("samples_per_block", "min_blocks", "max_blocks", "max_samples_per_block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StoppingRule.{name} must be a positive integer, got {value!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"StoppingRule.warmup must be an integer >= 0, got {self.warmup!r}")
        for name in ("min_time_s", "max_time_s", "min_block_s", "warmup_s", "max_block_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"StoppingRule.{name} must be a number >= 0, got {value!r}")
        for name in ("rel_halfwidth", "ratio_halfwidth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"StoppingRule.{name} must be a positive number, got {value!r}")
        if self.stop_on not in STOP_ON:
            raise ValueError(f"StoppingRule.stop_on must be one of {STOP_ON}, got {self.stop_on!r}")
        if self.min_blocks > self.max_blocks:
            raise ValueError(
                f"StoppingRule.min_blocks ({self.min_blocks}) is above max_blocks "
                f"({self.max_blocks})"
            )
        if self.samples_per_block > self.max_samples_per_block:
            raise ValueError(
                f"StoppingRule.samples_per_block ({self.samples_per_block}) is above "
                f"max_samples_per_block ({self.max_samples_per_block})"
            )

    def samples_for(self, sample_s: float) -> int:
        """Samples per block for samples of `sample_s` seconds each."""
        if self.min_block_s <= 0 or not sample_s > 0 or not math.isfinite(sample_s):
            return self.samples_per_block
        wanted = math.ceil(self.min_block_s / sample_s)
        return max(self.samples_per_block, min(wanted, self.max_samples_per_block))


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


class L2Flush:
    """Evicts the L2 between samples by touching a buffer twice its size (see the module
    docstring for the modes). Works on any torch device, so the CPU tests exercise it."""

    def __init__(self, nbytes: int, device: torch.device, mode: str = "read") -> None:
        if mode not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {FLUSH_MODES}, got {mode!r}")
        self.mode = mode
        self.nbytes = 0 if mode == "none" else nbytes - nbytes % 4
        # Zeros, so a read-back sum is exact and never overflows.
        self.buffer = torch.zeros(self.nbytes // 4, dtype=torch.int32, device=device)
        self.sink = torch.zeros((), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        if self.mode in ("write", "write_read"):
            self.buffer.zero_()
        if self.mode in ("read", "write_read"):
            torch.sum(self.buffer, dim=0, out=self.sink)


class GpuTimer:
    """Times captured CUDA graphs on the current stream, with the L2 flushed between samples.

    `flush` is "read" (default), "write" (zero the buffer), "write_read" or "none";
    `flush_l2=False` is the same as `flush="none"`."""

    def __init__(
        self, device: torch.device | str = "cuda", flush_l2: bool = True, flush: str = "read"
    ) -> None:
        if flush not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {FLUSH_MODES}, got {flush!r}")
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.flush_l2 = flush_l2 and flush != "none"
        self.flush_mode = flush if self.flush_l2 else "none"
        self._flush = L2Flush(2 * self.l2_bytes, self.device, self.flush_mode)
        self._cudart = _load_cudart()

    def reset_persisting_l2(self) -> bool:
        if self._cudart is None:
            return False
        return self._cudart.cudaCtxResetPersistingL2Cache() == 0

    def capture(self, fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
        """Warm `fn` up on a side stream, then capture one call; returns the graph and its output."""
        graph, out, _ = self.capture_held(fn)
        return graph, out

    def capture_held(self, fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object, int]:
        """`capture`, and the bytes the graph holds while it lives: its private memory pool
        (outputs and intermediates of the captured call), measured around the capture alone, so
        what warming up cached (a compiler's work, say) is not counted."""
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
                # Read inside: entering frees the cached blocks warming up left (empty_cache),
                # which would cancel out the pool's growth if read before.
                reserved = torch.cuda.memory_reserved(self.device)
                out = fn()
            _synchronize(self.device)
            held = torch.cuda.memory_reserved(self.device) - reserved
        except Exception as exc:
            raise CaptureError(f"{type(exc).__name__}: {exc}") from exc
        return graph, out, held

    def rotating(self, graphs: list[torch.cuda.CUDAGraph]) -> Callable[[int], list[float]]:
        """`block` over several captures of one callable, the next capture for each block
        (`CAPTURE_SLOTS` says why)."""
        turn = [0]

        def block(n: int) -> list[float]:
            turn[0] += 1
            return self.block(graphs[turn[0] % len(graphs)], n)

        return block

    def block(self, graph: torch.cuda.CUDAGraph, n: int) -> list[float]:
        """n samples of one replay each, in seconds."""
        starts = [_Event(enable_timing=True) for _ in range(n)]
        ends = [_Event(enable_timing=True) for _ in range(n)]
        self.reset_persisting_l2()
        flush = self._flush if self.flush_l2 else None
        for i in range(n):
            if flush is not None:
                flush()
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


@dataclass
class Interleaved:
    """What `measure_interleaved` did: every runner's block medians (paired by index), the
    samples per block it settled on (runner by runner in `sizes`), and why it stopped ("precision", "max_blocks",
    "max_time"). `halfwidth` is the last precision checked (relative; None if never checked)."""

    medians: list[list[float]]
    samples_per_block: int  # the most any runner took
    stop_reason: str
    seconds: float
    halfwidth: float | None
    remeasured: int = 0
    sizes: list[int] = field(default_factory=list)  # samples per block, runner by runner

    @property
    def blocks(self) -> int:
        return len(self.medians[0]) if self.medians else 0

    @property
    def n_samples(self) -> int:
        """Samples per runner that went into the medians."""
        return self.blocks * self.samples_per_block


def _precision(medians: list[list[float]], rule: StoppingRule) -> float:
    if rule.stop_on == "ratio" and len(medians) > 1:
        return max(paired_ratio_halfwidth(medians[0], m, n_boot=200) for m in medians[1:])
    return max(summarize(m, n_boot=200).rel_halfwidth for m in medians)


def _warm_up(runners: list[Callable[[int], list[float]]], rule: StoppingRule) -> list[int]:
    """Run the warm-up and return each runner's samples per block: what the fastest runner
    needs for `min_block_s`, capped for each runner at `max_block_s` of its own samples."""
    if rule.warmup == 0:
        return [rule.samples_per_block] * len(runners)
    start = _perf_counter()
    typical: list[float | None] = [None] * len(runners)
    while True:
        for i, run in enumerate(runners):
            samples = run(rule.warmup)
            if samples:
                typical[i] = median(samples)
        if _perf_counter() - start >= rule.warmup_s:
            break
    n = max([rule.samples_per_block, *(rule.samples_for(t) for t in typical if t is not None)])
    out = []
    for t in typical:
        cap = rule.max_samples_per_block
        if t is not None and t > 0 and math.isfinite(t):
            cap = max(rule.samples_per_block, math.floor(rule.max_block_s / t))
        out.append(min(n, cap))
    return out


def measure_interleaved(
    runners: list[Callable[[int], list[float]]],
    rule: StoppingRule | None = None,
    on_block: Callable[[int, int, list[float]], bool] | None = None,
) -> Interleaved:
    """Run each runner's block in turn (a random order, then its reverse, ...) until `rule`
    holds; see `Interleaved`.

    `runner(n)` returns n samples in seconds. `on_block(runner_index, block_index, samples)` may
    return False to have that block measured again (a throttled block, say); a block is retried
    at most twice."""
    if not runners:
        raise ValueError("measure_interleaved needs at least one runner")
    rule = rule or StoppingRule()
    sizes = _warm_up(runners, rule)
    medians: list[list[float]] = [[] for _ in runners]
    t0 = _perf_counter()
    order: list[int] = []
    next_check = rule.min_blocks
    halfwidth: float | None = None
    remeasured = 0
    while True:
        # Rounds come in pairs, a random order and then its reverse (ABBA or BAAB for two): a
        # linear drift cancels within each pair, and no runner always sits next to the same
        # neighbour (a slow peer's block before a candidate's can change the next block's clocks).
        if len(medians[0]) % 2 == 0:
            order = _SHUFFLE.sample(range(len(runners)), len(runners))
        else:
            order = order[::-1]
        for i in order:
            run = runners[i]
            for attempt in range(3):
                samples = run(sizes[i])
                remeasured += attempt > 0
                if on_block is None or on_block(i, len(medians[i]), samples):
                    break
            medians[i].append(median(samples))
        blocks = len(medians[0])
        elapsed = _perf_counter() - t0
        if blocks >= rule.max_blocks:
            reason = "max_blocks"
            break
        # min_blocks is a floor even past max_time_s: with many runners or long samples a few
        # blocks would fill the time, and three blocks give no interval worth reporting.
        if elapsed >= rule.max_time_s and blocks >= rule.min_blocks:
            reason = "max_time"
            break
        if blocks >= next_check and elapsed >= rule.min_time_s:
            halfwidth = _precision(medians, rule)
            if halfwidth <= (
                rule.ratio_halfwidth if _on_ratio(rule, runners) else rule.rel_halfwidth
            ):
                reason = "precision"
                break
            next_check = max(blocks + 1, math.ceil(blocks * _CHECK_GROWTH))
    return Interleaved(
        medians, max(sizes), reason, _perf_counter() - t0, halfwidth, remeasured, sizes
    )


def _on_ratio(rule: StoppingRule, runners: list) -> bool:
    return rule.stop_on == "ratio" and len(runners) > 1


def run_interleaved(
    runners: list[Callable[[int], list[float]]],
    rule: StoppingRule | None = None,
    on_block: Callable[[int, int, list[float]], bool] | None = None,
) -> list[list[float]]:
    """Each runner's block medians: `measure_interleaved(...).medians`."""
    return measure_interleaved(runners, rule, on_block).medians

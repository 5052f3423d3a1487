"""Peer-to-peer baselines of a host with several GPUs, and NCCL all-reduce bus bandwidth.

Per ordered GPU pair (src -> dst): whether peer access is supported; copy-engine bandwidth (a
`copy_` between devices, which the driver runs on a copy engine); SM bandwidth, pull (a kernel
on dst reads src's memory) and push (a kernel on src writes dst's memory); latency of a 4-byte
copy-engine copy and of a one-element SM store to the peer. All-reduce: one process per GPU
(`baselines.multiprocess`), `torch.distributed.all_reduce` captured in CUDA graphs over message
sizes from 4 KiB to 1 GiB; bus bandwidth = algorithm bandwidth x 2(n-1)/n, as nccl-tests count.

Timing is `baselines.timer`'s: graph replays (several ops per graph, so per-op figures are the
replay time over the op count) where capture works, else the host clock around a synchronised
call, said in a one-line note. Every rank runs the same fixed number of blocks (a collective
cannot stop early on one rank), and an all-reduce block's time is the slowest rank's.

One process sees every GPU here, so each capture uses a stream of the device being timed: torch's
default capture stream is made once, on whichever device captured first, and a later capture
"on" another GPU would run there while that GPU's events time an empty stream (the impossible
90 TB/s figures of the first H200 run). A cross-device `copy_` makes torch put barriers on both
devices' current streams; the destination's stream is forked from and joined to the capture so
the barriers stay inside the graph. Physical check: every GPU's own copy bandwidth and latency
are measured first (`LocalResult`); a peer bandwidth above the faster of the two GPUs' own copy
bandwidth, or a peer latency below half the slower one's own, is dropped with a note.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import torch

from baselines.multiprocess import RankContext, launch
from baselines.stats import summarize
from baselines.suite import Metric
from baselines.timer import CaptureError, GpuTimer, StoppingRule, cpu_block, run_interleaved

SCHEMA = "autotune.p2p/1"
KiB, MiB, GiB = 2**10, 2**20, 2**30
ALLREDUCE_MIN, ALLREDUCE_MAX = 4 * KiB, 1 * GiB


def allreduce_sizes(lo: int = ALLREDUCE_MIN, hi: int = ALLREDUCE_MAX, factor: int = 2) -> list[int]:
    """Message sizes in bytes from `lo` to `hi`, each `factor` times the last."""
    if lo <= 0 or hi < lo or factor < 2:
        raise ValueError(f"sizes need 0 < lo <= hi and factor >= 2, got {lo}, {hi}, {factor}")
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in bytes/s: nbytes/seconds x 2(n-1)/n (nccl-tests' convention)."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def fixed_rule(blocks: int, samples: int) -> StoppingRule:
    """Exactly `blocks` blocks of `samples` samples: the same on every rank."""
    return StoppingRule(
        samples_per_block=samples,
        min_blocks=blocks,
        max_blocks=blocks,
        max_time_s=1e9,
        warmup=2,
        min_block_s=0.0,
        stop_on="each",
    )


@dataclass(frozen=True)
class LocalResult:
    """One GPU's own copy figures, the physical bounds of its peer figures."""

    device: int
    metrics: list[Metric]
    notes: list[str] = field(default_factory=list)
    host_clock: list[str] = field(default_factory=list)  # metrics timed without a graph

    def bound(self, name: str) -> float | None:
        """Metric `name` as a physical bound: None when absent or timed on the host clock (its
        launch and synchronisation overheads would make it a false bound)."""
        if name in self.host_clock:
            return None
        return next((m.value for m in self.metrics if m.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "metrics": [m.to_dict() for m in self.metrics],
            "notes": list(self.notes),
            "host_clock": list(self.host_clock),
        }


@dataclass(frozen=True)
class PairResult:
    src: int
    dst: int
    peer_access: bool
    metrics: list[Metric]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "peer_access": self.peer_access,
            "metrics": [m.to_dict() for m in self.metrics],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class AllReducePoint:
    nbytes: int
    dtype: str
    world_size: int
    time_us: Metric
    algbw_gbps: float
    busbw_gbps: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["time_us"] = self.time_us.to_dict()
        return out


@dataclass
class P2PResult:
    device_count: int
    device_names: list[str]
    quick: bool
    pairs: list[PairResult]
    allreduce: list[AllReducePoint]
    backend: str
    local: list[LocalResult] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    created_at: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "device_count": self.device_count,
            "device_names": list(self.device_names),
            "quick": self.quick,
            "backend": self.backend,
            "created_at": self.created_at,
            "duration_s": self.duration_s,
            "versions": dict(self.versions),
            "topology": self.topology,
            "local": [r.to_dict() for r in self.local],
            "pairs": [p.to_dict() for p in self.pairs],
            "allreduce": [p.to_dict() for p in self.allreduce],
            "notes": list(self.notes),
        }


def _metric(name: str, unit: str, values: list[float], higher: bool, title: str) -> Metric:
    s = summarize(values)
    return Metric(name, unit, s.median, s.ci_low, s.ci_high, s.n, higher, title)


# --- per pair (one process, every GPU visible) ----------------------------------------------


def _copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    def launch_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
        n = src.numel()
        copy[(triton.cdiv(n, 4096),)](src, dst, n, BLOCK=4096, num_warps=8)

    return launch_copy


def short_error(exc: BaseException, limit: int = 160) -> str:
    """One line for a note: the exception's type and first line, plus the CUDA error name when
    the message carries one further down (torch's CUDA errors span several lines)."""
    text = str(exc)
    line = text.strip().splitlines()[0] if text.strip() else ""
    code = re.search(r"cudaError\w+", text)
    if code and code.group(0) not in line:
        line = f"{line} ({code.group(0)})"
    out = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _capture(device: torch.device, fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """`GpuTimer.capture` with the capture stream on `device` (see the module docstring)."""
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
            fn()
        torch.cuda.synchronize(device)
    except Exception as exc:
        raise CaptureError(short_error(exc)) from exc
    return graph


class _PairTimer:
    """Times callables on one device: graph replays of `ops` calls, else the host clock."""

    def __init__(self, device: int, rule: StoppingRule, notes: list[str]) -> None:
        self.device = torch.device("cuda", device)
        self.timer = GpuTimer(self.device)
        self.rule = rule
        self.notes = notes
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.host_clock: list[str] = []

    def per_op(self, label: str, fn: Callable[[], object], ops: int) -> list[float]:
        def burst() -> None:
            for _ in range(ops):
                fn()

        with torch.cuda.device(self.device):
            try:
                graph = _capture(self.device, burst)
                self.graphs.append(graph)
                runner = lambda n: self.timer.block(graph, n)  # noqa: E731
            except CaptureError as err:
                self.notes.append(f"{label}: timed on the host clock (no graph capture: {err})")
                self.host_clock.append(label)

                def synced() -> None:
                    burst()
                    torch.cuda.synchronize(self.device)

                runner = lambda n: cpu_block(synced, n)  # noqa: E731
            medians = run_interleaved([runner], self.rule)[0]
        return [m / ops for m in medians]


def _cross_copy(dst: torch.Tensor, src: torch.Tensor, dst_stream: torch.cuda.Stream) -> None:
    """`dst.copy_(src)` issued from src's current stream, with dst's current stream forked from
    it and joined back: inside a capture, torch's barrier on dst's stream is then captured too
    (on dst's default stream it invalidates the capture)."""
    here = torch.cuda.current_stream(src.device)
    dst_stream.wait_stream(here)
    with torch.cuda.stream(dst_stream), torch.cuda.stream(here):
        dst.copy_(src)
    here.wait_stream(dst_stream)


def _enable_peer(src: int, dst: int) -> None:
    """A copy started on `src` makes torch enable src -> dst peer access (get_p2p_access)."""
    a = torch.zeros(1, device=f"cuda:{src}")
    b = torch.empty(1, device=f"cuda:{dst}")
    b.copy_(a)
    torch.cuda.synchronize(src)


def _rule(quick: bool) -> StoppingRule:
    return fixed_rule(5 if quick else 15, 3)


def _nbytes(quick: bool) -> int:
    return (64 if quick else 256) * MiB


def measure_local(device: int, quick: bool) -> LocalResult:
    """GPU `device` copying within its own memory: copy-engine and SM bandwidth and latency."""
    notes: list[str] = []
    nbytes = _nbytes(quick)
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=f"cuda:{device}").uniform_()
    b = torch.empty_like(a)
    timer = _PairTimer(device, _rule(quick), notes)
    gbps = [nbytes / t / 1e9 for t in timer.per_op("ce_bandwidth", lambda: b.copy_(a), 1)]
    metrics = [_metric("ce_bandwidth", "GB/s", gbps, True, f"copy engine {device}->{device}")]
    tiny_a, tiny_b = a[:1], b[:1]
    lat = timer.per_op("ce_latency", lambda: tiny_b.copy_(tiny_a), 50)
    metrics.append(_metric("ce_latency", "us", [t * 1e6 for t in lat], False, "4 B local copy"))
    try:
        copy = _copy_kernel()
    except ImportError as err:
        notes.append(f"SM copies skipped: triton not importable: {err}")
        return LocalResult(device, metrics, notes, timer.host_clock)
    times = timer.per_op("sm_bandwidth", lambda: copy(a, b), 1)
    metrics.append(
        _metric("sm_bandwidth", "GB/s", [nbytes / t / 1e9 for t in times], True, "SM local copy")
    )
    lat = timer.per_op("sm_latency", lambda: copy(tiny_a, tiny_b), 50)
    metrics.append(
        _metric("sm_latency", "us", [t * 1e6 for t in lat], False, "1-element local store")
    )
    return LocalResult(device, metrics, notes, timer.host_clock)


_LATENCY_FLOOR = 0.5  # a peer latency below half the GPUs' own is a timing fault


def physical_check(
    metrics: list[Metric], src: LocalResult, dst: LocalResult
) -> tuple[list[Metric], list[str]]:
    """Drop the peer figures no link can produce: a bandwidth above the faster GPU's own copy
    bandwidth (copy engine or SM), or a latency below half the slower GPU's own latency of the
    same kind. Returns the metrics kept and a note per metric dropped."""
    kept, notes = [], []
    for m in metrics:
        kind = "ce" if m.name.startswith("ce_") else "sm"
        if m.unit == "GB/s":
            bounds = [
                v
                for r in (src, dst)
                for v in (r.bound("ce_bandwidth"), r.bound("sm_bandwidth"))
                if v is not None
            ]
            if bounds and m.value > max(bounds):
                notes.append(
                    f"{m.name} {m.title}: {m.value:.0f} GB/s is above the GPUs' own copy "
                    f"bandwidth ({max(bounds):.0f} GB/s): not physical, not reported"
                )
                continue
        elif m.unit == "us":
            bounds = [v for r in (src, dst) if (v := r.bound(f"{kind}_latency")) is not None]
            if bounds and m.value < _LATENCY_FLOOR * max(bounds):
                notes.append(
                    f"{m.name} {m.title}: {m.value:.3g} us is below half the GPUs' own "
                    f"({max(bounds):.3g} us): not physical, not reported"
                )
                continue
        kept.append(m)
    return kept, notes


def measure_pair(
    src: int, dst: int, quick: bool, local: dict[int, LocalResult] | None = None
) -> PairResult:
    """Bandwidths and latencies from GPU `src` to GPU `dst` (both visible to this process);
    figures that fail `physical_check` against `local` (measured here when not given) are
    dropped with a note."""
    notes: list[str] = []
    local = dict(local or {})
    for d in (src, dst):
        if d not in local:
            local[d] = measure_local(d, quick)
    access = bool(torch.cuda.can_device_access_peer(src, dst))
    rule = _rule(quick)
    nbytes = _nbytes(quick)
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=f"cuda:{src}").uniform_()
    b = torch.empty(nbytes // 4, dtype=torch.float32, device=f"cuda:{dst}")
    metrics = []
    if access:
        _enable_peer(src, dst)
        _enable_peer(dst, src)
    dst_stream = torch.cuda.Stream(dst)
    on_src = _PairTimer(src, rule, notes)
    times = on_src.per_op("ce_bandwidth", lambda: _cross_copy(b, a, dst_stream), 1)
    gbps = [nbytes / t / 1e9 for t in times]
    metrics.append(_metric("ce_bandwidth", "GB/s", gbps, True, f"copy engine {src}->{dst}"))
    tiny_a, tiny_b = a[:1], b[:1]
    lat = on_src.per_op("ce_latency", lambda: _cross_copy(tiny_b, tiny_a, dst_stream), 50)
    metrics.append(
        _metric("ce_latency", "us", [t * 1e6 for t in lat], False, f"4 B copy {src}->{dst}")
    )
    if not access:
        notes.append(f"no peer access {src}->{dst}: SM copies skipped, copies staged by host")
    else:
        try:
            copy = _copy_kernel()
        except ImportError as err:
            notes.append(f"SM copies skipped: triton not importable: {err}")
            copy = None
        if copy is not None:
            on_dst = _PairTimer(dst, rule, notes)
            pull = on_dst.per_op("sm_pull_bandwidth", lambda: copy(a, b), 1)
            push = on_src.per_op("sm_push_bandwidth", lambda: copy(a, b), 1)
            for name, times, title in (
                ("sm_pull_bandwidth", pull, f"SM pull: kernel on {dst} reads {src}"),
                ("sm_push_bandwidth", push, f"SM push: kernel on {src} writes {dst}"),
            ):
                gbps = [nbytes / t / 1e9 for t in times]
                metrics.append(_metric(name, "GB/s", gbps, True, title))
            store = on_src.per_op("sm_latency", lambda: copy(tiny_a, tiny_b), 50)
            us = [t * 1e6 for t in store]
            metrics.append(_metric("sm_latency", "us", us, False, f"1-element store {src}->{dst}"))
    kept, dropped = physical_check(metrics, local[src], local[dst])
    return PairResult(src, dst, access, kept, notes + dropped)


# --- all-reduce (one process per GPU) -------------------------------------------------------


def _ops_per_graph(nbytes: int) -> int:
    return 20 if nbytes < MiB else 5 if nbytes < 64 * MiB else 1


def allreduce_rank(
    ctx: RankContext, sizes: list[int], dtype: str, blocks: int, samples: int
) -> dict[int, list[float]]:
    """Rank function: per message size, this rank's block medians of one all-reduce (seconds)."""
    import torch.distributed as dist

    rule = fixed_rule(blocks, samples)
    torch_dtype = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    out: dict[int, list[float]] = {}
    timer = GpuTimer(ctx.device) if ctx.is_cuda else None
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // itemsize), dtype=torch_dtype, device=ctx.device)
        ops = _ops_per_graph(nbytes) if ctx.is_cuda else 1

        def burst(x: torch.Tensor = x, ops: int = ops) -> None:
            for _ in range(ops):
                dist.all_reduce(x)

        if timer is not None:
            graph, _ = timer.capture(burst)
            medians = run_interleaved([lambda n, g=graph: timer.block(g, n)], rule)[0]
            del graph
        else:
            medians = run_interleaved([lambda n, f=burst: cpu_block(f, n)], rule)[0]
        out[nbytes] = [m / ops for m in medians]
        del x
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    return out


def combine_ranks(per_rank: list[list[float]]) -> list[float]:
    """Per block, the slowest rank's time: a collective ends when its last rank does."""
    return [max(blocks) for blocks in zip(*per_rank, strict=True)]


def measure_allreduce(
    world_size: int,
    sizes: list[int],
    *,
    backend: str = "nccl",
    dtype: str = "float32",
    quick: bool = False,
    timeout_s: float = 600.0,
) -> list[AllReducePoint]:
    """All-reduce time and bus bandwidth per message size, one process per rank."""
    blocks, samples = (5, 5) if quick else (15, 10)
    kwargs = {"sizes": sizes, "dtype": dtype, "blocks": blocks, "samples": samples}
    ranks = launch(
        "baselines.p2p:allreduce_rank", world_size, kwargs, backend=backend, timeout_s=timeout_s
    )
    points = []
    for nbytes in sizes:
        times = combine_ranks([r[nbytes] for r in ranks])
        metric = _metric(
            f"allreduce_{nbytes}", "us", [t * 1e6 for t in times], False, f"all-reduce {nbytes} B"
        )
        seconds = metric.value / 1e6
        points.append(
            AllReducePoint(
                nbytes=nbytes,
                dtype=dtype,
                world_size=world_size,
                time_us=metric,
                algbw_gbps=nbytes / seconds / 1e9,
                busbw_gbps=bus_bandwidth(nbytes, seconds, world_size) / 1e9,
            )
        )
    return points


def _versions() -> dict[str, str | None]:
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError):
            nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}


def run_p2p_suite(
    quick: bool = False,
    devices: list[int] | None = None,
    sizes: list[int] | None = None,
    allreduce: bool = True,
    progress: Callable[[str], None] | None = None,
) -> P2PResult:
    """Peer-to-peer figures for every ordered pair of `devices` (all GPUs by default) and NCCL
    all-reduce over `sizes` (4 KiB..1 GiB, x2 steps; x4 when `quick`). With fewer than two GPUs
    the result holds no figures and a note saying why; topology facts are read either way."""
    from host_tuning.topology import gather_topology

    say = progress or (lambda _message: None)
    started = time.perf_counter()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = list(range(count)) if devices is None else list(devices)
    bad = [d for d in devices if not 0 <= d < count]
    if bad:
        raise ValueError(f"devices: {bad} not among the {count} GPUs torch sees")
    say("p2p: reading the GPU topology")
    result = P2PResult(
        device_count=count,
        device_names=[torch.cuda.get_device_name(d) for d in devices],
        quick=quick,
        pairs=[],
        allreduce=[],
        backend="nccl",
        topology=gather_topology().to_dict(),
        versions=_versions(),
        created_at=created,
    )
    if len(devices) < 2:
        result.notes.append(f"peer-to-peer needs two or more GPUs; torch sees {count}")
    else:
        local = {}
        for d in devices:
            say(f"p2p: GPU {d} own copies")
            local[d] = measure_local(d, quick)
            result.local.append(local[d])
            torch.cuda.empty_cache()
        for src in devices:
            for dst in devices:
                if src != dst:
                    say(f"p2p: GPU {src} -> GPU {dst}")
                    result.pairs.append(measure_pair(src, dst, quick, local))
                    torch.cuda.empty_cache()
        if allreduce:
            if devices != list(range(len(devices))):
                result.notes.append("all-reduce runs on GPUs 0..n-1, one process each")
            wanted = sizes or allreduce_sizes(factor=4 if quick else 2)
            say(f"p2p: NCCL all-reduce over {len(devices)} GPUs, {len(wanted)} sizes")
            result.allreduce = measure_allreduce(len(devices), wanted, quick=quick)
    result.duration_s = round(time.perf_counter() - started, 3)
    return result

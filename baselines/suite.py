"""The host baseline suite: what this host can do, each figure with its confidence interval.

GPU (`run_suite("cuda")`): device copy bandwidth, host<->device bandwidth (pinned and pageable),
bf16 and fp8 GEMM rates, eager launch latency, CUDA-graph replay latency per kernel, host memory
bandwidth. CPU (`run_suite("cpu")`): host memory bandwidth, fp32 GEMM rate, the Python-side
cost of a tiny torch op. Every figure is timed by `baselines.timer` (graph replays on the GPU,
the host clock otherwise) in blocks; a metric's value is the median of its block values and its
interval the bootstrap interval of `baselines.stats.summarize`. Pageable transfers and eager
launches run on the host clock (with a device synchronize in each sample): a pageable copy
cannot be captured, and launch cost is host time. On the GPU an NVML sampler watches every
block and a throttled block is measured again (`baselines.telemetry`).

Conventions: copy bandwidths count bytes read plus bytes written; transfers count the bytes
moved; a GEMM of n^3 is 2 n^3 FLOP; latencies are per op or per kernel, in microseconds.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch
from rich.table import Table

from baselines.environment import Environment, detect_environment
from baselines.roofline import kernel_copy
from baselines.stats import summarize
from baselines.telemetry import (
    BlockRecord,
    TelemetrySampler,
    clean_block_hook,
    nvml_index_of,
    summarize_records,
)
from baselines.timer import CaptureError, GpuTimer, StoppingRule, cpu_block, run_interleaved
from host_tuning.fact import REAL_ROOT, read_text
from host_tuning.nvml import NvmlBackend, probe_nvml

SCHEMA = "autotune.baseline/1"
MiB = 2**20
OPS_PER_SAMPLE = 100  # tiny ops per host-timed sample, and kernels per graph
GEMM_N = 8192
FP8_MIN_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    value: float
    ci_low: float
    ci_high: float
    n: int  # blocks
    higher_is_better: bool
    title: str = ""
    blocks: tuple[float, ...] = ()  # each block's value, in `unit`
    processes: int = 1  # how many processes measured it (see `baselines.suite_processes`)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "blocks": list(self.blocks)}

    @classmethod
    def from_dict(cls, doc: Any, where: str = "metric") -> Metric:
        """Read back `to_dict()`; a ValueError names the offending field."""
        if not isinstance(doc, dict):
            raise ValueError(f"{where} must be an object")
        for key in ("name", "unit"):
            if not isinstance(doc.get(key), str) or not doc[key]:
                raise ValueError(f"{where}.{key} must be a non-empty string")
        numbers = {}
        for key in ("value", "ci_low", "ci_high"):
            value = doc.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{where}.{key} must be a number, got {value!r}")
            if not np.isfinite(value) or value <= 0:
                raise ValueError(f"{where}.{key} must be a positive finite number, got {value!r}")
            numbers[key] = float(value)
        if not numbers["ci_low"] <= numbers["value"] <= numbers["ci_high"]:
            raise ValueError(
                f"{where}: ci_low <= value <= ci_high does not hold "
                f"({numbers['ci_low']}, {numbers['value']}, {numbers['ci_high']})"
            )
        n = doc.get("n")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}.n must be a positive integer, got {n!r}")
        if not isinstance(doc.get("higher_is_better"), bool):
            raise ValueError(f"{where}.higher_is_better must be true or false")
        title = doc.get("title", "")
        if not isinstance(title, str):
            raise ValueError(f"{where}.title must be a string")
        blocks = doc.get("blocks", [])
        if not isinstance(blocks, list) or not all(
            isinstance(b, int | float) and not isinstance(b, bool) and np.isfinite(b) and b > 0
            for b in blocks
        ):
            raise ValueError(f"{where}.blocks must be a list of positive finite numbers")
        processes = doc.get("processes", 1)
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"{where}.processes must be a positive integer, got {processes!r}")
        return cls(
            name=doc["name"],
            unit=doc["unit"],
            n=n,
            higher_is_better=doc["higher_is_better"],
            title=title,
            blocks=tuple(float(b) for b in blocks),
            processes=processes,
            **numbers,
        )


@dataclass
class BaselineResult:
    device: str  # "cpu" or "cuda:N"
    device_name: str
    quick: bool
    metrics: list[Metric]
    environment: Environment
    telemetry: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    created_at: str = ""
    duration_s: float = 0.0
    source: str = "suite"

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": self.source,
            "device": self.device,
            "device_name": self.device_name,
            "quick": self.quick,
            "created_at": self.created_at,
            "duration_s": self.duration_s,
            "versions": dict(self.versions),
            "environment": self.environment.to_dict(),
            "metrics": [m.to_dict() for m in self.metrics],
            "telemetry": self.telemetry,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, doc: Any, where: str = "baseline") -> BaselineResult:
        """Read back `to_dict()` (or a reference file); a ValueError names the offending field."""
        if not isinstance(doc, dict):
            raise ValueError(f"{where} must be a JSON object")
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"{where}.schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
        metrics = doc.get("metrics")
        if not isinstance(metrics, list):
            raise ValueError(f"{where}.metrics must be a list")
        parsed = [Metric.from_dict(m, f"{where}.metrics[{i}]") for i, m in enumerate(metrics)]
        names = [m.name for m in parsed]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"{where}.metrics: metric {dup!r} appears more than once")
        for key in ("device", "device_name", "source"):
            if key in doc and not isinstance(doc[key], str):
                raise ValueError(f"{where}.{key} must be a string")
        notes = doc.get("notes", [])
        if not isinstance(notes, list):
            raise ValueError(f"{where}.notes must be a list")
        telemetry = doc.get("telemetry", {})
        if not isinstance(telemetry, dict):
            raise ValueError(f"{where}.telemetry must be an object")
        return cls(
            device=doc.get("device", "unknown"),
            device_name=doc.get("device_name", "unknown"),
            quick=bool(doc.get("quick", False)),
            metrics=parsed,
            environment=Environment.from_dict(doc.get("environment"), f"{where}.environment"),
            telemetry=telemetry,
            notes=[str(n) for n in notes],
            versions=dict(doc.get("versions") or {}),
            created_at=str(doc.get("created_at", "")),
            duration_s=float(doc.get("duration_s", 0.0) or 0.0),
            source=doc.get("source", "suite"),
        )


def default_device() -> str:
    """ "cuda" where torch sees a GPU, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# --- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    name: str
    title: str
    unit: str
    higher_is_better: bool = True
    # Meant to run at the power limit, where the clock follows the power controller and the
    # GPU's temperature: measured after a longer warm-up, in blocks long enough to average
    # over the controller's swings, and a power slowdown is its normal state (see `_rule`).
    power_bound: bool = False


SPECS = {
    s.name: s
    for s in (
        _Spec("device_copy_bandwidth", "device copy bandwidth", "TB/s"),
        _Spec("h2d_pinned_bandwidth", "host-to-device bandwidth, pinned", "GB/s"),
        _Spec("d2h_pinned_bandwidth", "device-to-host bandwidth, pinned", "GB/s"),
        _Spec("h2d_pageable_bandwidth", "host-to-device bandwidth, pageable", "GB/s"),
        _Spec("d2h_pageable_bandwidth", "device-to-host bandwidth, pageable", "GB/s"),
        _Spec("bf16_gemm", f"bf16 GEMM {GEMM_N}^3", "TFLOP/s", power_bound=True),
        _Spec("fp8_gemm", f"fp8 GEMM {GEMM_N}^3", "TFLOP/s", power_bound=True),
        _Spec("eager_launch_latency", "launch latency", "us", higher_is_better=False),
        _Spec(
            "graph_kernel_latency", "graph replay latency per kernel", "us", higher_is_better=False
        ),
        _Spec("host_memory_bandwidth", "host memory bandwidth", "GB/s"),
        _Spec("cpu_fp32_gemm", "CPU fp32 GEMM", "GFLOP/s"),
        _Spec("torch_op_overhead", "tiny torch op overhead", "us", higher_is_better=False),
    )
}


def _rule(quick: bool, samples: int, power_bound: bool = False) -> StoppingRule:
    """One metric, one runner: stop on its own median's interval. The warm-up runs for a time
    as well as a count, so an idle GPU has ramped its clocks before a block counts.

    A power-bound metric warms up for a second, so the power controller has taken over, and its
    blocks last at least 50 ms, so each averages over the controller's swings and the interval
    spans the slower drift that a second process sees too. (With the plain rule, two processes
    differed by 2.2 % on the H200's fp8 GEMM, each outside the other's interval.)"""
    rule = StoppingRule(
        samples_per_block=samples,
        min_blocks=5,
        max_blocks=15 if quick else 30,
        max_time_s=0.8 if quick else 1.5,
        rel_halfwidth=0.005,
        warmup=2,
        stop_on="each",
        warmup_s=0.05 if quick else 0.2,
    )
    if not power_bound:
        return rule
    return replace(
        rule,
        min_blocks=5 if quick else 10,
        max_blocks=15 if quick else 60,
        max_time_s=0.8 if quick else 3.0,
        warmup_s=0.2 if quick else 1.0,
        min_block_s=0.01 if quick else 0.05,
    )


def _measure(
    name: str,
    runner: Callable[[int], list[float]],
    rule: StoppingRule,
    convert: Callable[[float], float],
    on_block: Callable[[int, int, list[float]], bool] | None = None,
    title: str | None = None,
) -> Metric:
    """Blocks of `runner` until `rule` holds; each block median (seconds) goes through
    `convert` into the metric's unit before the median and its interval are taken."""
    spec = SPECS[name]
    medians = run_interleaved([runner], rule, on_block=on_block)[0]
    blocks = [convert(t) for t in medians]
    summary = summarize(blocks)
    return Metric(
        name=name,
        unit=spec.unit,
        value=summary.median,
        ci_low=summary.ci_low,
        ci_high=summary.ci_high,
        n=summary.n,
        higher_is_better=spec.higher_is_better,
        title=title or spec.title,
        blocks=tuple(blocks),
    )


def _rate(work: float) -> Callable[[float], float]:
    return lambda seconds: work / seconds


def _per_op_us(ops: int) -> Callable[[float], float]:
    return lambda seconds: seconds / ops * 1e6


def _last_level_cache_bytes() -> int:
    """Size of the largest CPU cache of cpu0 per sysfs (0 when not exposed)."""
    sizes = [0]
    for index in range(8):
        text = read_text(REAL_ROOT, f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        if not text.known:
            break
        raw = str(text.value).upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(raw[-1:], 1)
        digits = raw.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


def _host_copy_bytes() -> int:
    """256 MiB, or more so that source and destination each exceed twice the last-level cache."""
    return max(256 * MiB, 2 * _last_level_cache_bytes())


def _host_memory_bandwidth(quick: bool) -> Metric:
    nbytes = _host_copy_bytes()
    src = torch.rand(nbytes // 4)
    dst = torch.empty_like(src)
    return _measure(
        "host_memory_bandwidth",
        lambda n: cpu_block(lambda: dst.copy_(src), n),
        _rule(quick, 2),
        _rate(2 * nbytes / 1e9),
    )


def _cpu_gemm(quick: bool) -> Metric:
    n = 512 if quick else 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    return _measure(
        "cpu_fp32_gemm",
        lambda k: cpu_block(lambda: torch.mm(a, b, out=c), k),
        _rule(quick, 3),
        _rate(2 * n**3 / 1e9),
        title=f"CPU fp32 GEMM {n}^3",
    )


def _torch_op_overhead(quick: bool) -> Metric:
    x = torch.rand(1)

    def burst() -> None:
        for _ in range(OPS_PER_SAMPLE):
            x.add_(1.0)

    return _measure(
        "torch_op_overhead",
        lambda n: cpu_block(burst, n),
        _rule(quick, 10),
        _per_op_us(OPS_PER_SAMPLE),
    )


@dataclass
class _GpuRun:
    device: torch.device
    timer: GpuTimer
    quick: bool
    sampler: TelemetrySampler | None
    records: list[BlockRecord] = field(default_factory=list)
    # Graphs stay alive until the suite ends: once every graph captured into the timer's pool is
    # gone while the pool still holds memory (cuBLAS workspaces), torch refuses the next capture.
    graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def hook(self, name: str) -> Callable[[int, int, list[float]], bool] | None:
        if self.sampler is None:
            return None
        steady = SPECS[name].power_bound
        return clean_block_hook(self.sampler, self.records, label=name, power_is_steady=steady)

    def graph_runner(self, fn: Callable[[], object]) -> Callable[[int], list[float]]:
        graph, _ = self.timer.capture(fn)
        self.graphs.append(graph)
        return lambda n: self.timer.block(graph, n)

    def host_runner(
        self, fn: Callable[[], object], fresh: Callable[[], None] | None = None
    ) -> Callable[[int], list[float]]:
        """Blocks on the host clock. What one process holds fixed for its whole life (the CPU
        it runs on, where its host buffers landed) changes between blocks here, so the
        interval covers what a second process would see: each block runs on the next CPU of
        this process's set, after `fresh()` (say, new host buffers) outside the timed part."""
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        turn = [0]

        def synced() -> None:
            fn()
            torch.cuda.synchronize(self.device)

        def block(n: int) -> list[float]:
            if fresh is not None:
                fresh()
            if not cpus:
                return cpu_block(synced, n)
            turn[0] += 1
            os.sched_setaffinity(0, {cpus[turn[0] % len(cpus)]})
            try:
                return cpu_block(synced, n)
            finally:
                os.sched_setaffinity(0, cpus)

        return block

    def measure(
        self,
        name: str,
        runner: Callable[[int], list[float]],
        samples: int,
        convert: Callable[[float], float],
    ) -> None:
        rule = _rule(self.quick, samples, SPECS[name].power_bound)
        metric = _measure(name, runner, rule, convert, self.hook(name))
        self.metrics.append(metric)


def _device_copy(run: _GpuRun) -> None:
    nbytes = 1024 * MiB
    runner = run.graph_runner(kernel_copy(nbytes, run.device))
    run.measure("device_copy_bandwidth", runner, 10, _rate(2 * nbytes / 1e12))


def _transfers(run: _GpuRun) -> None:
    # Pinned copies are graph replays of 256 MiB; pageable ones cannot be captured and run at a
    # fraction of the speed on the host clock, so 64 MiB keeps their blocks short.
    # A pageable copy's speed depends on where its host pages landed (huge pages or not), which
    # is fixed for one buffer: every pageable block gets a new buffer.
    for pinned, nbytes, samples in ((True, 256 * MiB, 5), (False, 64 * MiB, 3)):
        dev = torch.empty(nbytes // 4, dtype=torch.float32, device=run.device).uniform_()
        host = [torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=pinned).uniform_()]
        kind = "pinned" if pinned else "pageable"

        def new_host(h=host, numel=nbytes // 4) -> None:
            h[0] = torch.empty(numel, dtype=torch.float32).uniform_()

        for name, fn in (
            (f"h2d_{kind}_bandwidth", lambda d=dev, h=host, nb=pinned: d.copy_(h[0], non_blocking=nb)),
            (f"d2h_{kind}_bandwidth", lambda d=dev, h=host, nb=pinned: h[0].copy_(d, non_blocking=nb)),
        ):  # fmt: skip
            runner = None
            if pinned:
                try:
                    runner = run.graph_runner(fn)
                except CaptureError as err:
                    run.notes.append(f"{name} timed on the host clock: no graph capture: {err}")
            runner = runner or run.host_runner(fn, None if pinned else new_host)
            run.measure(name, runner, samples, _rate(nbytes / 1e9))


def _bf16_gemm(run: _GpuRun) -> None:
    n = GEMM_N
    a = torch.randn(n, n, device=run.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=run.device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=run.device, dtype=torch.bfloat16)
    runner = run.graph_runner(lambda: torch.mm(a, b, out=c))
    run.measure("bf16_gemm", runner, 10, _rate(2 * n**3 / 1e12))


def _fp8_gemm(run: _GpuRun) -> None:
    n = GEMM_N
    capability = torch.cuda.get_device_capability(run.device)
    if capability < FP8_MIN_CAPABILITY:
        run.notes.append(
            f"fp8 GEMM not measured: compute capability {capability[0]}.{capability[1]} "
            f"is under {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]}"
        )
        return
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        run.notes.append(f"fp8 GEMM not measured: torch {torch.__version__} has no _scaled_mm")
        return
    a8 = torch.randn(n, n, device=run.device).to(torch.float8_e4m3fn)
    b8 = torch.randn(n, n, device=run.device).to(torch.float8_e4m3fn).t()  # column-major
    scale = torch.ones((), device=run.device, dtype=torch.float32)
    runner = run.graph_runner(
        lambda: torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    )
    run.measure("fp8_gemm", runner, 10, _rate(2 * n**3 / 1e12))


def _latencies(run: _GpuRun) -> None:
    x = torch.rand(1, device=run.device)

    def burst() -> None:
        for _ in range(OPS_PER_SAMPLE):
            x.add_(1.0)

    per_op = _per_op_us(OPS_PER_SAMPLE)
    run.measure("eager_launch_latency", run.host_runner(burst), 5, per_op)
    run.measure("graph_kernel_latency", run.graph_runner(burst), 10, per_op)


# The power-bound GEMMs come last: the GPU stays at its power limit for a while after them.
GPU_GROUPS: list[tuple[str, Callable[[_GpuRun], None]]] = [
    ("device copy bandwidth", _device_copy),
    ("host<->device transfers", _transfers),
    ("launch and graph replay latency", _latencies),
    ("bf16 GEMM", _bf16_gemm),
    ("fp8 GEMM", _fp8_gemm),
]
CPU_METRICS: list[tuple[str, Callable[[bool], Metric]]] = [
    ("host memory bandwidth", _host_memory_bandwidth),
    ("CPU fp32 GEMM", _cpu_gemm),
    ("tiny torch op overhead", _torch_op_overhead),
]


def parse_device(device: str) -> torch.device:
    """`device` as a torch device with its index resolved; ValueError when it is not there."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: torch sees no CUDA device on this host")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) visible"
            )
        dev = torch.device("cuda", index)
    return dev


def _cpu_name() -> str:
    text = read_text(REAL_ROOT, "/proc/cpuinfo")
    for line in str(text.value or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return platform.processor() or platform.machine()


def _versions(backend: NvmlBackend | None) -> dict[str, str | None]:
    driver = backend.read_system("driver_version") if backend is not None else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": np.__version__,
        "driver": str(driver.value) if driver is not None and driver.ok else None,
    }


def _run_cpu(quick: bool, say: Callable[[str], None]) -> list[Metric]:
    metrics = []
    for title, fn in CPU_METRICS:
        say(f"baseline: {title}")
        metrics.append(fn(quick))
    return metrics


def _run_gpu(
    device: torch.device,
    quick: bool,
    backend: NvmlBackend | None,
    nvml_reason: str | None,
    say: Callable[[str], None],
) -> tuple[list[Metric], dict[str, Any], list[str]]:
    index = nvml_index_of(backend, device) if backend is not None else None
    if backend is not None and index is None:
        nvml_reason = f"no NVML device matches {device} (UUID or PCI bus id)"
    sampler = None
    if backend is not None and index is not None:
        sampler = TelemetrySampler(backend, index)
    with torch.cuda.device(device), sampler or contextlib.nullcontext():
        run = _GpuRun(device, GpuTimer(device), quick, sampler)
        for title, group in GPU_GROUPS:
            say(f"baseline: {title}")
            try:
                group(run)
            except (CaptureError, RuntimeError) as err:
                run.notes.append(f"{title}: stopped by {type(err).__name__}: {err}")
            torch.cuda.empty_cache()
    say("baseline: host memory bandwidth")
    metrics = [*run.metrics, _host_memory_bandwidth(quick)]
    if sampler is None:
        telemetry: dict[str, Any] = {"available": False, "reason": nvml_reason}
    else:
        names = dict.fromkeys(r.label for r in run.records)
        telemetry = {
            "available": True,
            "nvml_index": index,
            "period_s": sampler.period_s,
            "samples": sampler.sample_count,
            "error": sampler.error,
            "overall": summarize_records(run.records),
            "metrics": {
                name: {
                    **summarize_records([r for r in run.records if r.label == name]),
                    "power_bound": SPECS[name].power_bound,
                }
                for name in names
            },
        }
    return metrics, telemetry, run.notes


def run_suite(
    device: str, quick: bool = False, progress: Callable[[str], None] | None = None
) -> BaselineResult:
    """Measure this host's baselines on `device` ("cpu", "cuda" or "cuda:N").

    `quick` measures fewer blocks (and a smaller CPU GEMM, named in its title), for a CPU suite
    within a few seconds on 2 cores; sizes are otherwise the same, so quick and full runs
    compare. A metric that
    cannot be measured here (fp8 on an older GPU, a failed capture) is left out with a note.
    Raises ValueError for a device that is not there.
    """
    dev = parse_device(device)
    say = progress or (lambda _message: None)
    started = time.perf_counter()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    backend: NvmlBackend | None = None
    nvml_reason: str | None = "CPU suite: no GPU to watch"
    if dev.type == "cuda":
        probe = probe_nvml()
        backend, nvml_reason = probe.backend, probe.reason
    try:
        say("baseline: detecting the environment")
        environment = detect_environment(nvml=backend)
        versions = _versions(backend)
        if dev.type == "cuda":
            metrics, telemetry, notes = _run_gpu(dev, quick, backend, nvml_reason, say)
            name = torch.cuda.get_device_name(dev)
        else:
            metrics, notes = _run_cpu(quick, say), []
            telemetry = {"available": False, "reason": nvml_reason}
            name = _cpu_name()
    finally:
        if backend is not None:
            backend.close()
    return BaselineResult(
        device=str(dev),
        device_name=name,
        quick=quick,
        metrics=metrics,
        environment=environment,
        telemetry=telemetry,
        notes=notes,
        versions=versions,
        created_at=created,
        duration_s=round(time.perf_counter() - started, 3),
    )


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def render_result(result: BaselineResult | dict[str, Any]) -> Table:
    """A rich table of a suite result (or its dict form): value, 95 % interval, blocks."""
    if isinstance(result, dict):
        result = BaselineResult.from_dict(result)
    table = Table(
        title=f"Baseline: {result.device_name} ({result.device}), {result.environment.label}",
        caption="\n".join(result.notes) or None,
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95 % interval", justify="right")
    table.add_column("unit")
    table.add_column("better")
    table.add_column("blocks", justify="right")
    for m in result.metrics:
        table.add_row(
            m.title or m.name,
            _fmt(m.value),
            f"[{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]",
            m.unit,
            "higher" if m.higher_is_better else "lower",
            f"{m.n} in {m.processes} processes" if m.processes > 1 else str(m.n),
        )
    return table

"""GPU telemetry during measured blocks: an NVML sampler thread, per-block summaries, and the
hook that has `run_interleaved` measure a throttled block again.

    with TelemetrySampler(backend, index) as sampler:
        log: list[BlockRecord] = []
        medians = run_interleaved(runners, rule, on_block=clean_block_hook(sampler, log))
    summarize_records(log)

The sampler reads `host_tuning.nvml.read_telemetry` every `period_s` in a daemon thread;
`take()` closes the current window (adding one read at that moment, so a block shorter than the
period still has a sample) and summarizes it. NVML is only read here, never written.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from host_tuning.nvml import NvmlBackend, Telemetry, read_telemetry
from host_tuning.nvml_base import POWER_REASONS, THERMAL_REASONS


@dataclass(frozen=True)
class BlockTelemetry:
    """What NVML showed during one window (a measured block)."""

    samples: int
    duration_s: float
    sm_clock_min_mhz: int | None
    sm_clock_median_mhz: float | None
    mem_clock_median_mhz: float | None
    max_temperature_c: int | None
    max_power_w: float | None
    reasons: list[str]  # every clock event reason seen in the window
    thermal_slowdown: bool
    power_slowdown: bool

    @property
    def slowdown(self) -> bool:
        return self.thermal_slowdown or self.power_slowdown

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_samples(samples: list[Telemetry]) -> BlockTelemetry:
    """Summary of a list of samples (values NVML could not give are left out)."""
    sm = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    mem = [s.mem_clock_mhz for s in samples if s.mem_clock_mhz is not None]
    temps = [s.temperature_c for s in samples if s.temperature_c is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    reasons = sorted({name for s in samples for name in s.clock_event_reason_names})
    times = [s.monotonic for s in samples]
    return BlockTelemetry(
        samples=len(samples),
        duration_s=max(times) - min(times) if times else 0.0,
        sm_clock_min_mhz=min(sm) if sm else None,
        sm_clock_median_mhz=float(statistics.median(sm)) if sm else None,
        mem_clock_median_mhz=float(statistics.median(mem)) if mem else None,
        max_temperature_c=max(temps) if temps else None,
        max_power_w=max(power) if power else None,
        reasons=reasons,
        thermal_slowdown=bool(set(reasons) & THERMAL_REASONS),
        power_slowdown=bool(set(reasons) & POWER_REASONS),
    )


class TelemetrySampler:
    """Reads GPU `index` of `backend` every `period_s` seconds while the context is open."""

    def __init__(self, backend: NvmlBackend, index: int, period_s: float = 0.01) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        backend.read(index, "clock_sm_current_mhz")  # a bad index fails here, naming it
        self.backend = backend
        self.index = index
        self.period_s = period_s
        self.error: str | None = None
        self.sample_count = 0
        self._window: list[Telemetry] = []  # only the open window is kept: memory stays bounded
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> TelemetrySampler:
        self._stop.clear()
        try:
            self._read()  # the first read is here, not whenever the thread first runs
        except Exception as exc:  # as in the thread: a dying driver must not stop the measuring
            self.error = f"{type(exc).__name__}: {exc}"
        self._thread = threading.Thread(target=self._run, name="nvml-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _read(self) -> None:
        sample = read_telemetry(self.backend, self.index)
        with self._lock:
            self._window.append(sample)
            self.sample_count += 1

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.period_s):
                self._read()
        except Exception as exc:  # a dying driver must not take the measurement down with it
            self.error = f"{type(exc).__name__}: {exc}"

    def take(self) -> BlockTelemetry:
        """Summary of the samples since the previous `take()` (or the start), plus one read now."""
        self._read()
        with self._lock:
            window, self._window = self._window, []
        return summarize_samples(window)


def block_is_clean(
    summary: BlockTelemetry,
    median_clock: float | None,
    max_drop: float = 0.05,
    power_is_steady: bool = False,
) -> bool:
    """False when the block saw a thermal or power slowdown, or an SM clock more than `max_drop`
    (a fraction) under `median_clock`; a block without clock readings is judged on reasons only.
    `power_is_steady`: the work is meant to run at the power limit (a large GEMM), so a power
    slowdown is its normal state, recorded but not a reason to measure again."""
    if summary.thermal_slowdown or (summary.power_slowdown and not power_is_steady):
        return False
    if median_clock is None or summary.sm_clock_min_mhz is None:
        return True
    return summary.sm_clock_min_mhz >= (1.0 - max_drop) * median_clock


@dataclass(frozen=True)
class BlockRecord:
    """One measured block as the hook saw it; `clean` False means it was measured again
    (unless it was the last allowed attempt)."""

    runner: int
    block: int
    telemetry: BlockTelemetry
    clean: bool
    label: str = ""  # what was measured, so logs of several measurements can be pooled

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "runner": self.runner,
            "block": self.block,
            "clean": self.clean,
            **self.telemetry.to_dict(),
        }


def clean_block_hook(
    sampler: TelemetrySampler,
    log: list[BlockRecord],
    max_drop: float = 0.05,
    label: str = "",
    power_is_steady: bool = False,
) -> Callable[[int, int, list[float]], bool]:
    """An `on_block` for `run_interleaved`: records each block's telemetry in `log` and asks for
    a block again when it is not clean (see `block_is_clean`). The reference clock is the median
    over the blocks seen so far (this one included) of their median SM clock. `label` tags the
    records."""
    sampler.take()  # start the first window here, not when the sampler started

    def on_block(runner: int, block: int, samples: list[float]) -> bool:
        summary = sampler.take()
        clocks = [r.telemetry.sm_clock_median_mhz for r in log if r.clean and r.label == label]
        if summary.sm_clock_median_mhz is not None:
            clocks.append(summary.sm_clock_median_mhz)
        reference = float(statistics.median(clocks)) if clocks else None
        clean = block_is_clean(summary, reference, max_drop, power_is_steady)
        log.append(BlockRecord(runner, block, summary, clean, label))
        return clean

    return on_block


def summarize_records(records: list[BlockRecord]) -> dict[str, Any]:
    """JSON-ready summary of a measurement's blocks: clocks, temperature, power, reasons seen,
    how many blocks were measured and how many of them were measured again."""
    if not records:
        return {"blocks": 0, "remeasured_blocks": 0}
    kept = {(r.label, r.runner, r.block): r for r in records}  # a block's last attempt counts
    every = [r.telemetry for r in records]
    last = [r.telemetry for r in kept.values()]
    mins = [t.sm_clock_min_mhz for t in every if t.sm_clock_min_mhz is not None]
    meds = [t.sm_clock_median_mhz for t in last if t.sm_clock_median_mhz is not None]
    temps = [t.max_temperature_c for t in every if t.max_temperature_c is not None]
    power = [t.max_power_w for t in every if t.max_power_w is not None]
    mems = [t.mem_clock_median_mhz for t in last if t.mem_clock_median_mhz is not None]
    return {
        # min, median and max over the kept blocks (clocks: the blocks' medians, the lowest
        # single reading as min; temperature and power: each block's highest reading)
        "sm_clock_mhz": _spread(meds, low=min(mins) if mins else None),
        "mem_clock_mhz": _spread(mems),
        "temperature_c": _spread([t.max_temperature_c for t in last if t.max_temperature_c]),
        "power_w": _spread([t.max_power_w for t in last if t.max_power_w is not None]),
        "blocks": len(kept),
        "remeasured_blocks": len(records) - len(kept),
        "unclean_blocks_kept": sum(not r.clean for r in kept.values()),
        "sm_clock_min_mhz": min(mins) if mins else None,
        "sm_clock_median_mhz": float(statistics.median(meds)) if meds else None,
        "max_temperature_c": max(temps) if temps else None,
        "max_power_w": max(power) if power else None,
        "reasons": sorted({name for r in records for name in r.telemetry.reasons}),
        "thermal_slowdown_blocks": sum(r.telemetry.thermal_slowdown for r in records),
        "power_slowdown_blocks": sum(r.telemetry.power_slowdown for r in records),
    }


def _spread(values: list[float], low: float | None = None) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": float(min(values) if low is None else min(low, *values)),
        "median": float(statistics.median(values)),
        "max": float(max(values)),
    }


def nvml_index_for(backend: NvmlBackend, uuid: str | None, pci_bus_id: str | None) -> int | None:
    """The NVML index of the GPU with this UUID (with or without the "GPU-" prefix) or PCI bus id
    ("0000:00:06.0" or NVML's 8-digit-domain form); None when no device matches."""

    def norm_uuid(text: Any) -> str:
        return str(text).lower().removeprefix("gpu-")

    def norm_bus(text: Any) -> tuple[int, int, str] | None:
        parts = str(text).lower().split(":")
        if len(parts) == 2:
            parts.insert(0, "0")
        try:
            return int(parts[0], 16), int(parts[1], 16), parts[2]
        except (ValueError, IndexError):
            return None

    wanted_bus = norm_bus(pci_bus_id) if pci_bus_id else None
    for index in range(backend.device_count()):
        if uuid:
            got = backend.read(index, "uuid")
            if got.ok and norm_uuid(got.value) == norm_uuid(uuid):
                return index
        if wanted_bus is not None:
            got = backend.read(index, "pci_bus_id")
            if got.ok and norm_bus(got.value) == wanted_bus:
                return index
    return None


def nvml_index_of(backend: NvmlBackend, device: Any) -> int | None:
    """The NVML index of torch CUDA `device` (its UUID, else its PCI bus id: torch and NVML
    number GPUs differently under CUDA_VISIBLE_DEVICES); None when no NVML device matches."""
    import torch

    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "") or None
    bus = None
    if hasattr(props, "pci_bus_id"):
        domain = getattr(props, "pci_domain_id", 0)
        bus = f"{domain:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return nvml_index_for(backend, uuid, bus)

"""GPU telemetry over a whole run: SM and memory clocks, temperature, power and clock-event
reasons read from NVML at a fixed period in a daemon thread, each sample tagged with the stage
that was running. The report plots it as "clocks and temperature over the run".

    with RunTelemetry(backend, index) as telemetry:
        telemetry.label = "loop"
        ...
    telemetry.to_dict()   # {"period_s", "gpu_index", "samples": [{"t_s", ...}]}

NVML is only read here. Samples are bounded: past `max_samples` every other one is dropped
and the period doubles, so a long run keeps its whole span at a coarser grain.
"""

from __future__ import annotations

import time
from typing import Any

from baselines.telemetry import TelemetrySampler
from host_tuning.nvml import NvmlBackend, read_telemetry


class RunTelemetry(TelemetrySampler):
    """The block sampler's thread, keeping every sample (labelled) instead of windows."""

    def __init__(
        self, backend: NvmlBackend, index: int, period_s: float = 0.5, max_samples: int = 2000
    ) -> None:
        super().__init__(backend, index, period_s)
        self.max_samples = max(2, max_samples)
        self.label = ""
        self.samples: list[dict[str, Any]] = []
        self._start = time.monotonic()

    def __enter__(self) -> RunTelemetry:
        self._start = time.monotonic()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._read()  # the state at the end, however short the run

    def _read(self) -> None:
        try:
            s = read_telemetry(self.backend, self.index)
        except Exception as exc:  # a dying driver must not take the run down with it
            self.error = f"{type(exc).__name__}: {exc}"
            return
        sample = {
            "t_s": max(0.0, s.monotonic - self._start),
            "sm_clock_mhz": s.sm_clock_mhz,
            "mem_clock_mhz": s.mem_clock_mhz,
            "temperature_c": s.temperature_c,
            "power_w": s.power_w,
            "reasons": list(s.clock_event_reason_names),
        }
        if self.label:
            sample["label"] = self.label
        with self._lock:
            self.samples.append(sample)
            self.sample_count += 1
            if len(self.samples) > self.max_samples:
                self.samples = self.samples[::2]
                self.period_s *= 2

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            samples = list(self.samples)
        return {"period_s": self.period_s, "gpu_index": self.index, "samples": samples}

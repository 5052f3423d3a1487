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

import threading
import time
from typing import Any

from host_tuning.nvml import NvmlBackend, read_telemetry


class RunTelemetry:
    def __init__(
        self, backend: NvmlBackend, index: int, period_s: float = 0.5, max_samples: int = 2000
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, got {period_s!r}")
        backend.read(index, "clock_sm_current_mhz")  # a bad index fails here, naming it
        self.backend = backend
        self.index = index
        self.period_s = period_s
        self.max_samples = max(2, max_samples)
        self.label = ""
        self.error: str | None = None
        self.samples: list[dict[str, Any]] = []
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RunTelemetry:
        self._start = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="run-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
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
        self.samples.append(sample)
        if len(self.samples) > self.max_samples:
            self.samples = self.samples[::2]
            self.period_s *= 2

    def _run(self) -> None:
        self._read()
        while not self._stop.wait(self.period_s):
            self._read()

    def to_dict(self) -> dict[str, Any]:
        return {"period_s": self.period_s, "gpu_index": self.index, "samples": list(self.samples)}

"""One telemetry sample of a GPU (clocks, temperature, power, clock event reasons).

Baselines take one before and after each measured block to tell a throttled
block from a clean one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from host_tuning.nvml_base import (
    POWER_REASONS,
    THERMAL_REASONS,
    NvmlBackend,
    decode_clock_event_reasons,
)


@dataclass(frozen=True)
class Telemetry:
    """A sample; a value NVML could not give is None and its reason is in `unavailable`."""

    index: int
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    clock_event_reasons: int | None
    clock_event_reason_names: list[str]
    time: float  # seconds since the epoch
    monotonic: float  # time.monotonic() at the same moment, for intervals
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def throttled(self) -> bool:
        """True when a thermal or power reason held the clocks down."""
        return bool(set(self.clock_event_reason_names) & (THERMAL_REASONS | POWER_REASONS))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throttled": self.throttled}


_SAMPLED = {
    "sm_clock_mhz": "clock_sm_current_mhz",
    "mem_clock_mhz": "clock_memory_current_mhz",
    "temperature_c": "temperature_c",
    "power_w": "power_usage_mw",
    "clock_event_reasons": "clock_event_reasons_current",
}


def read_telemetry(backend: NvmlBackend, index: int) -> Telemetry:
    """Sample GPU `index` now. Never raises for a getter NVML cannot answer."""
    now, mono = time.time(), time.monotonic()
    values: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for name, nvml_field in _SAMPLED.items():
        reading = backend.read(index, nvml_field)
        values[name] = reading.value
        if not reading.ok:
            unavailable[name] = reading.reason or "unknown"
    if values["power_w"] is not None:
        values["power_w"] = values["power_w"] / 1000.0
    mask = values["clock_event_reasons"]
    names = decode_clock_event_reasons(mask) if isinstance(mask, int) else []
    return Telemetry(
        index=index,
        clock_event_reason_names=names,
        time=now,
        monotonic=mono,
        unavailable=unavailable,
        **values,
    )

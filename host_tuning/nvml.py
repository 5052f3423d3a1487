"""NVML behind one small interface: the real library or a simulated device.

    backend = open_nvml()                                  # RealNvml, or None
    backend = SimulatedNvml.from_fixture("h200-passthrough-vm")
    backend.read(0, "pcie_link_gen_current")               # Reading(value, reason)
    read_telemetry(backend, 0)                             # Telemetry

`probe_nvml()` gives the backend together with the reason when it is None.
"""

from __future__ import annotations

from host_tuning.nvml_base import (
    CLOCK_EVENT_REASONS,
    COMPUTE_MODES,
    DEVICE_FIELDS,
    SYSTEM_FIELDS,
    VIRTUALIZATION_MODES,
    NvmlBackend,
    NvmlError,
    NvmlNotSupportedError,
    NvmlPermissionError,
    NvmlValueError,
    Reading,
    decode_clock_event_reasons,
    read_all,
)
from host_tuning.nvml_real import NvmlProbe, RealNvml, probe_nvml
from host_tuning.nvml_sim import SimulatedNvml, fixture_names, load_fixture
from host_tuning.telemetry import Telemetry, read_telemetry

__all__ = [
    "CLOCK_EVENT_REASONS",
    "COMPUTE_MODES",
    "DEVICE_FIELDS",
    "SYSTEM_FIELDS",
    "VIRTUALIZATION_MODES",
    "NvmlBackend",
    "NvmlError",
    "NvmlNotSupportedError",
    "NvmlPermissionError",
    "NvmlProbe",
    "NvmlValueError",
    "Reading",
    "RealNvml",
    "SimulatedNvml",
    "Telemetry",
    "decode_clock_event_reasons",
    "fixture_names",
    "load_fixture",
    "open_nvml",
    "probe_nvml",
    "read_all",
    "read_telemetry",
]


def open_nvml() -> NvmlBackend | None:
    """The real NVML when the driver loads, else None (`probe_nvml().reason` says why)."""
    return probe_nvml().backend

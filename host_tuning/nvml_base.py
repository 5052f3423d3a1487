"""The NVML interface shared by the real library and the simulated device.

A backend answers reads by field name (the vocabulary is `DEVICE_FIELDS` and
`SYSTEM_FIELDS`) with a `Reading`: a value, or None and the reason. Reads never
raise for a device-side error. Writes raise `NvmlError` subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

CLOCK_DOMAINS = ("graphics", "sm", "memory", "video")
CLOCK_KINDS = ("current", "max", "applications", "default_applications", "customer_boost_max")

# field name -> what it is (units in the name). Every backend answers all of them.
DEVICE_FIELDS: dict[str, str] = {
    "name": "product name",
    "uuid": "GPU UUID",
    "serial": "board serial number",
    "vbios_version": "VBIOS version",
    "board_part_number": "board part number",
    "pci_bus_id": "PCI bus id as NVML writes it (8-digit domain)",
    "pci_device_id": "PCI device id and vendor id (device << 16 | vendor)",
    "cuda_compute_capability": "[major, minor]",
    "num_gpu_cores": "number of CUDA cores",
    "memory_bus_width_bits": "memory bus width in bits",
    "persistence_mode": "1 enabled, 0 disabled",
    "compute_mode": "0 default, 1 exclusive thread, 2 prohibited, 3 exclusive process",
    "virtualization_mode": "0 none, 1 passthrough, 2 vgpu, 3 host vgpu, 4 host vsga",
    "host_vgpu_mode": "0 non-SR-IOV, 1 SR-IOV",
    "gsp_firmware_mode": "[enabled, default]",
    "pcie_link_gen_current": "current PCIe link generation",
    "pcie_link_gen_max": "max PCIe generation of this GPU in this system",
    "pcie_link_gen_gpu_max": "max PCIe generation the GPU supports",
    "pcie_link_width_current": "current PCIe link width (lanes)",
    "pcie_link_width_max": "max PCIe link width (lanes)",
    "pcie_speed_mbps": "PCIe per-lane transfer rate in Mbps (32000 = 32 GT/s)",
    "pcie_replay_counter": "PCIe replays since reset",
    "power_limit_mw": "power management limit (mW)",
    "power_limit_constraints_mw": "[min, max] settable power limit (mW)",
    "power_limit_default_mw": "default power limit (mW)",
    "power_limit_enforced_mw": "power limit enforced from all sources (mW)",
    "power_usage_mw": "power draw now (mW)",
    "total_energy_mj": "energy since driver load (mJ)",
    "temperature_c": "GPU temperature (C)",
    "temperature_shutdown_c": "shutdown threshold (C)",
    "temperature_slowdown_c": "slowdown threshold (C)",
    "temperature_memory_max_c": "memory max operating threshold (C)",
    "temperature_gpu_max_c": "GPU max operating threshold (C)",
    "performance_state": "P-state (0 fastest)",
    "clock_event_reasons_current": "bitmask of active clock event (throttle) reasons",
    "clock_event_reasons_supported": "bitmask of supported clock event reasons",
    "ecc_mode": "[current, pending], 1 enabled",
    "mig_mode": "[current, pending], 1 enabled",
    "memory_total_bytes": "framebuffer memory (bytes)",
    "bar1_total_bytes": "BAR1 aperture (bytes)",
    "auto_boosted_clocks": "[enabled, default]",
    **{
        f"clock_{domain}_{kind}_mhz": f"{domain} clock, {kind.replace('_', ' ')} (MHz)"
        for domain in CLOCK_DOMAINS
        for kind in CLOCK_KINDS
    },
    "supported_memory_clocks_mhz": "supported memory clocks (MHz)",
    "supported_graphics_clocks_mhz": "{memory clock: [supported graphics clocks]} (MHz)",
    "graphics_clock_range_p0_mhz": "[min, max] graphics clock in P0 (MHz)",
    "gpc_clk_vf_offset_mhz": "graphics clock V/F offset (MHz)",
    "mem_clk_vf_offset_mhz": "memory clock V/F offset (MHz)",
    "gpc_clk_vf_offset_range_mhz": "[min, max] allowed graphics clock offset (MHz)",
    "mem_clk_vf_offset_range_mhz": "[min, max] allowed memory clock offset (MHz)",
    "cpu_affinity": "CPUs close to the GPU (list of CPU numbers)",
    "numa_node": "NUMA node of the GPU",
    "fan_speed_pct": "fan speed (percent)",
    "compute_processes": "pids of compute processes on the GPU",
}

SYSTEM_FIELDS: dict[str, str] = {
    "driver_version": "NVIDIA driver version",
    "nvml_version": "NVML library version",
    "cuda_driver_version": "CUDA version the driver supports (13000 = 13.0)",
}

CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown"})

VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clock event reason bitmask (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    if rest:
        names.append(f"unknown_0x{rest:x}")
    return names


@dataclass(frozen=True)
class Reading:
    """One NVML answer: `value`, or None and `reason` saying why not."""

    value: Any = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


class NvmlError(Exception):
    """A write the device refused; `code` is stable, the message names the field."""

    code = "nvml_error"


class NvmlPermissionError(NvmlError):
    code = "no_permission"


class NvmlValueError(NvmlError):
    code = "invalid_argument"


class NvmlNotSupportedError(NvmlError):
    code = "not_supported"


@runtime_checkable
class NvmlBackend(Protocol):
    """What host_tuning needs from NVML. Reads return `Reading`; writes raise `NvmlError`."""

    kind: str  # "real" or "simulated"

    def device_count(self) -> int: ...

    def read(self, index: int, field: str) -> Reading: ...

    def read_system(self, field: str) -> Reading: ...

    def close(self) -> None: ...

    # Write path (used by profiles/apply; never called by facts or checks).
    def set_persistence_mode(self, index: int, enabled: bool) -> None: ...

    def set_power_limit(self, index: int, milliwatts: int) -> None: ...

    def set_gpu_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None: ...

    def reset_gpu_locked_clocks(self, index: int) -> None: ...

    def set_memory_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None: ...

    def reset_memory_locked_clocks(self, index: int) -> None: ...

    def set_applications_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None: ...

    def reset_applications_clocks(self, index: int) -> None: ...

    def set_gpc_clk_vf_offset(self, index: int, offset_mhz: int) -> None: ...

    def set_mem_clk_vf_offset(self, index: int, offset_mhz: int) -> None: ...


def check_field(field: str) -> None:
    """Raise ValueError naming `field` when it is not in the vocabulary."""
    if field not in DEVICE_FIELDS:
        raise ValueError(f"unknown NVML device field {field!r}")


def check_index(index: int, count: int) -> None:
    """Raise ValueError when `index` is not a device index below `count`."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
        raise ValueError(f"device index {index!r} out of range: {count} device(s)")


def read_all(backend: NvmlBackend, index: int) -> dict[str, Reading]:
    """Every device field of one GPU."""
    return {field: backend.read(index, field) for field in DEVICE_FIELDS}

"""The real NVML backend (pynvml).

Every getter that fails (NVMLError, a function the installed pynvml or driver
lacks) gives a `Reading` with value None and the reason. Writes refuse unless the
backend was opened with `writable=True` (`probe_nvml(writable=True)`), which only
the journaled apply path (`autotune host apply --apply`, `host restore`) does;
NVML errors of a write become `NvmlError` subclasses naming the setting.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from ctypes import c_int, c_uint
from dataclasses import dataclass
from typing import Any

from host_tuning.nvml_base import (
    CLOCK_DOMAINS,
    DEVICE_FIELDS,
    SYSTEM_FIELDS,
    NvmlError,
    NvmlNotSupportedError,
    NvmlPermissionError,
    NvmlValueError,
    Reading,
    check_field,
    check_index,
)

_READ_ERRORS: tuple[type[BaseException], ...] = (AttributeError, OSError, TypeError, ValueError)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cpu_list(words: Any, bits_per_word: int) -> list[int]:
    return [
        word_index * bits_per_word + bit
        for word_index, word in enumerate(words)
        for bit in range(bits_per_word)
        if int(word) >> bit & 1
    ]


def _getters(nv: Any) -> dict[str, Callable[[Any], Any]]:
    """pynvml call per device field; each returns a JSON-friendly value."""

    def pair(name: str) -> Callable[[Any], list[Any]]:
        return lambda h: list(getattr(nv, name)(h))

    def minmax(name: str, *args: Any) -> Callable[[Any], list[int]]:
        def get(h: Any) -> list[int]:
            lo, hi = (c_int(), c_int()) if "Offset" in name else (c_uint(), c_uint())
            return list(getattr(nv, name)(h, *args, lo, hi))

        return get

    def affinity(h: Any) -> list[int]:
        bits = 64
        words = max(1, -(-(os.cpu_count() or 1) // bits))
        return _cpu_list(nv.nvmlDeviceGetCpuAffinity(h, words), bits)

    def supported_graphics(h: Any) -> dict[str, list[int]]:
        return {
            str(mem): list(nv.nvmlDeviceGetSupportedGraphicsClocks(h, mem))
            for mem in nv.nvmlDeviceGetSupportedMemoryClocks(h)
        }

    def event_reasons(h: Any) -> int:
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        return int((fn or nv.nvmlDeviceGetCurrentClocksThrottleReasons)(h))

    def supported_reasons(h: Any) -> int:
        fn = getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons", None)
        return int((fn or nv.nvmlDeviceGetSupportedClocksThrottleReasons)(h))

    def threshold(kind: str) -> Callable[[Any], int]:
        return lambda h: nv.nvmlDeviceGetTemperatureThreshold(h, getattr(nv, kind))

    getters: dict[str, Callable[[Any], Any]] = {
        "name": lambda h: _text(nv.nvmlDeviceGetName(h)),
        "uuid": lambda h: _text(nv.nvmlDeviceGetUUID(h)),
        "serial": lambda h: _text(nv.nvmlDeviceGetSerial(h)),
        "vbios_version": lambda h: _text(nv.nvmlDeviceGetVbiosVersion(h)),
        "board_part_number": lambda h: _text(nv.nvmlDeviceGetBoardPartNumber(h)),
        "pci_bus_id": lambda h: _text(nv.nvmlDeviceGetPciInfo(h).busId),
        "pci_device_id": lambda h: int(nv.nvmlDeviceGetPciInfo(h).pciDeviceId),
        "cuda_compute_capability": pair("nvmlDeviceGetCudaComputeCapability"),
        "num_gpu_cores": lambda h: nv.nvmlDeviceGetNumGpuCores(h),
        "memory_bus_width_bits": lambda h: nv.nvmlDeviceGetMemoryBusWidth(h),
        "persistence_mode": lambda h: nv.nvmlDeviceGetPersistenceMode(h),
        "compute_mode": lambda h: nv.nvmlDeviceGetComputeMode(h),
        "virtualization_mode": lambda h: nv.nvmlDeviceGetVirtualizationMode(h),
        "host_vgpu_mode": lambda h: nv.nvmlDeviceGetHostVgpuMode(h),
        "gsp_firmware_mode": pair("nvmlDeviceGetGspFirmwareMode"),
        "pcie_link_gen_current": lambda h: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_link_gen_max": lambda h: nv.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_link_gen_gpu_max": lambda h: nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h),
        "pcie_link_width_current": lambda h: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        "pcie_link_width_max": lambda h: nv.nvmlDeviceGetMaxPcieLinkWidth(h),
        "pcie_speed_mbps": lambda h: nv.nvmlDeviceGetPcieSpeed(h),
        "pcie_replay_counter": lambda h: nv.nvmlDeviceGetPcieReplayCounter(h),
        "power_limit_mw": lambda h: nv.nvmlDeviceGetPowerManagementLimit(h),
        "power_limit_constraints_mw": pair("nvmlDeviceGetPowerManagementLimitConstraints"),
        "power_limit_default_mw": lambda h: nv.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "power_limit_enforced_mw": lambda h: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "power_usage_mw": lambda h: nv.nvmlDeviceGetPowerUsage(h),
        "total_energy_mj": lambda h: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "temperature_c": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "temperature_shutdown_c": threshold("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
        "temperature_slowdown_c": threshold("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
        "temperature_memory_max_c": threshold("NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
        "temperature_gpu_max_c": threshold("NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
        "performance_state": lambda h: nv.nvmlDeviceGetPerformanceState(h),
        "clock_event_reasons_current": event_reasons,
        "clock_event_reasons_supported": supported_reasons,
        "ecc_mode": pair("nvmlDeviceGetEccMode"),
        "mig_mode": pair("nvmlDeviceGetMigMode"),
        "memory_total_bytes": lambda h: int(nv.nvmlDeviceGetMemoryInfo(h).total),
        "bar1_total_bytes": lambda h: int(nv.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total),
        "auto_boosted_clocks": pair("nvmlDeviceGetAutoBoostedClocksEnabled"),
        "supported_memory_clocks_mhz": lambda h: list(nv.nvmlDeviceGetSupportedMemoryClocks(h)),
        "supported_graphics_clocks_mhz": supported_graphics,
        "graphics_clock_range_p0_mhz": minmax(
            "nvmlDeviceGetMinMaxClockOfPState", nv.NVML_CLOCK_GRAPHICS, 0
        ),
        "gpc_clk_vf_offset_mhz": lambda h: nv.nvmlDeviceGetGpcClkVfOffset(h),
        "mem_clk_vf_offset_mhz": lambda h: nv.nvmlDeviceGetMemClkVfOffset(h),
        "gpc_clk_vf_offset_range_mhz": minmax("nvmlDeviceGetGpcClkMinMaxVfOffset"),
        "mem_clk_vf_offset_range_mhz": minmax("nvmlDeviceGetMemClkMinMaxVfOffset"),
        "cpu_affinity": affinity,
        "numa_node": lambda h: nv.nvmlDeviceGetNumaNodeId(h),
        "fan_speed_pct": lambda h: nv.nvmlDeviceGetFanSpeed(h),
        "compute_processes": lambda h: [
            int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
        ],
    }
    clock_types = {
        "graphics": nv.NVML_CLOCK_GRAPHICS,
        "sm": nv.NVML_CLOCK_SM,
        "memory": nv.NVML_CLOCK_MEM,
        "video": nv.NVML_CLOCK_VIDEO,
    }
    for domain in CLOCK_DOMAINS:
        ct = clock_types[domain]
        getters[f"clock_{domain}_current_mhz"] = lambda h, ct=ct: nv.nvmlDeviceGetClockInfo(h, ct)
        getters[f"clock_{domain}_max_mhz"] = lambda h, ct=ct: nv.nvmlDeviceGetMaxClockInfo(h, ct)
        getters[f"clock_{domain}_applications_mhz"] = lambda h, ct=ct: (
            nv.nvmlDeviceGetApplicationsClock(h, ct)
        )
        getters[f"clock_{domain}_default_applications_mhz"] = lambda h, ct=ct: (
            nv.nvmlDeviceGetDefaultApplicationsClock(h, ct)
        )
        getters[f"clock_{domain}_customer_boost_max_mhz"] = lambda h, ct=ct: nv.nvmlDeviceGetClock(
            h, ct, nv.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX
        )
    missing = set(DEVICE_FIELDS) - set(getters)
    assert not missing, f"no pynvml getter for {sorted(missing)}"
    return getters


class RealNvml:
    """NVML through pynvml. Create with `open_nvml()`; `close()` shuts NVML down."""

    kind = "real"

    def __init__(self, nv: Any, *, writable: bool = False) -> None:
        self._nv = nv
        self.writable = writable
        self._getters = _getters(nv)
        self._handles: dict[int, Any] = {}
        self._count: int | None = None
        self._closed = False

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (self._nv.NVMLError, *_READ_ERRORS)

    def device_count(self) -> int:
        """Number of GPUs NVML sees; raises NvmlError when NVML cannot count them."""
        if self._count is None:
            try:
                self._count = int(self._nv.nvmlDeviceGetCount())
            except self._errors() as err:
                raise NvmlError(f"NVML device count: {err}") from err
        return self._count

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def read(self, index: int, field: str) -> Reading:
        check_field(field)
        try:
            count = self.device_count()
        except NvmlError as err:
            return Reading(None, str(err))
        check_index(index, count)
        try:
            return Reading(self._getters[field](self._handle(index)))
        except self._errors() as err:
            return Reading(None, _reason(err))

    def read_system(self, field: str) -> Reading:
        if field not in SYSTEM_FIELDS:
            raise ValueError(f"unknown NVML system field {field!r}")
        calls = {
            "driver_version": lambda: _text(self._nv.nvmlSystemGetDriverVersion()),
            "nvml_version": lambda: _text(self._nv.nvmlSystemGetNVMLVersion()),
            "cuda_driver_version": lambda: int(self._nv.nvmlSystemGetCudaDriverVersion()),
        }
        try:
            return Reading(calls[field]())
        except self._errors() as err:
            return Reading(None, _reason(err))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._handles.clear()
            try:
                self._nv.nvmlShutdown()
            except self._errors():
                pass

    def __enter__(self) -> RealNvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, what: str, index: int, call: str, *args: Any) -> None:
        """Run pynvml `call` on GPU `index`; NVML's refusal becomes an NvmlError naming `what`."""
        if not self.writable:
            raise NvmlPermissionError(
                f"{what}: this NVML backend is read-only; changes go through the journaled "
                "apply path (autotune host apply --apply), which opens it writable"
            )
        check_index(index, self.device_count())
        try:
            getattr(self._nv, call)(self._handle(index), *args)
        except AttributeError as err:
            raise NvmlNotSupportedError(f"{what}: {_reason(err)}") from err
        except self._nv.NVMLError as err:
            raise _write_error(self._nv, what, err) from err

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        state = self._nv.NVML_FEATURE_ENABLED if enabled else self._nv.NVML_FEATURE_DISABLED
        self._write("persistence_mode", index, "nvmlDeviceSetPersistenceMode", state)

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        self._write("power_limit_mw", index, "nvmlDeviceSetPowerManagementLimit", milliwatts)

    def set_gpu_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        self._write("gpu_locked_clocks", index, "nvmlDeviceSetGpuLockedClocks", min_mhz, max_mhz)

    def reset_gpu_locked_clocks(self, index: int) -> None:
        self._write("gpu_locked_clocks", index, "nvmlDeviceResetGpuLockedClocks")

    def set_memory_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        self._write(
            "memory_locked_clocks", index, "nvmlDeviceSetMemoryLockedClocks", min_mhz, max_mhz
        )

    def reset_memory_locked_clocks(self, index: int) -> None:
        self._write("memory_locked_clocks", index, "nvmlDeviceResetMemoryLockedClocks")

    def set_applications_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        self._write(
            "applications_clocks",
            index,
            "nvmlDeviceSetApplicationsClocks",
            memory_mhz,
            graphics_mhz,
        )

    def reset_applications_clocks(self, index: int) -> None:
        self._write("applications_clocks", index, "nvmlDeviceResetApplicationsClocks")

    def set_gpc_clk_vf_offset(self, index: int, offset_mhz: int) -> None:
        self._write("gpc_clk_vf_offset_mhz", index, "nvmlDeviceSetGpcClkVfOffset", offset_mhz)

    def set_mem_clk_vf_offset(self, index: int, offset_mhz: int) -> None:
        self._write("mem_clk_vf_offset_mhz", index, "nvmlDeviceSetMemClkVfOffset", offset_mhz)


def _write_error(nv: Any, what: str, err: BaseException) -> NvmlError:
    """The NvmlError subclass for an NVMLError of a setter."""
    value = getattr(err, "value", None)
    kinds = {
        getattr(nv, "NVML_ERROR_NO_PERMISSION", -1): NvmlPermissionError,
        getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", -1): NvmlValueError,
        getattr(nv, "NVML_ERROR_NOT_SUPPORTED", -1): NvmlNotSupportedError,
    }
    return kinds.get(value, NvmlError)(f"{what}: {_reason(err)}")


def _reason(err: BaseException) -> str:
    if isinstance(err, AttributeError):
        return f"not available in the installed pynvml/driver: {err}"
    text = str(err) or type(err).__name__
    return f"NVML: {text}" if type(err).__name__.startswith("NVMLError") else text


@dataclass(frozen=True)
class NvmlProbe:
    """Result of trying to load NVML: a backend, or None and why."""

    backend: RealNvml | None
    reason: str | None


def probe_nvml(*, writable: bool = False) -> NvmlProbe:
    """Load NVML; never raises. The reason says what was missing (module, library, driver).

    `writable=True` lets the backend's setters change the GPU: only for the
    journaled apply/restore path, never for facts, checks or telemetry.
    """
    try:
        import pynvml as nv
    except ImportError as err:
        return NvmlProbe(None, f"pynvml (nvidia-ml-py) is not installed: {err}")
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        return NvmlProbe(None, f"NVML did not load: {err}")
    except OSError as err:
        return NvmlProbe(None, f"NVML did not load: {err}")
    return NvmlProbe(RealNvml(nv, writable=writable), None)

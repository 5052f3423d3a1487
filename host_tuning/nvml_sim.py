"""A simulated NVML device built from recorded facts (JSON fixtures in host_tuning/data).

It answers the same reads as the real library and enforces the same write
constraints: values outside what the part reports raise `NvmlValueError`, parts
without a setting raise `NvmlNotSupportedError`, and a device built with
`root=False` raises `NvmlPermissionError` on every write. With
`noop_writes=True` setters succeed without effect, as some real ones do.

Fixture format: {"schema": "autotune.simulated-nvml/1", "system": {field: value},
"devices": [{"fields": {field: value}}]}; a value {"nvml_error": "Not Supported"}
is a getter that fails with that NVML error; a field left out reads as
"not recorded in fixture".
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from host_tuning.jsonfile import read_json
from host_tuning.nvml_base import (
    DEVICE_FIELDS,
    SYSTEM_FIELDS,
    NvmlNotSupportedError,
    NvmlPermissionError,
    NvmlValueError,
    Reading,
    check_field,
    check_index,
)

SCHEMA = "autotune.simulated-nvml/1"
DATA_DIR = Path(__file__).parent / "data"
_APPLICATIONS_CLOCKS_BIT = 0x2


def fixture_names() -> list[str]:
    """Names of the fixtures shipped in host_tuning/data."""
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


def _resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return path
    candidate = DATA_DIR / f"{name_or_path}.json"
    if not candidate.exists():
        raise ValueError(
            f"unknown NVML fixture {str(name_or_path)!r}; shipped: {', '.join(fixture_names())}"
        )
    return candidate


def load_fixture(name_or_path: str | Path) -> dict[str, Any]:
    """Read and validate a fixture; errors name the file and the offending field."""
    path = _resolve(name_or_path)
    doc = read_json(path, "NVML fixture")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"NVML fixture {path}: field 'schema' must be {SCHEMA!r}")
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        raise ValueError(f"NVML fixture {path}: field 'devices' must be a non-empty list")
    for field in doc.get("system", {}):
        if field not in SYSTEM_FIELDS:
            raise ValueError(f"NVML fixture {path}: unknown field 'system.{field}'")
    for i, device in enumerate(devices):
        fields = device.get("fields") if isinstance(device, dict) else None
        if not isinstance(fields, dict):
            raise ValueError(f"NVML fixture {path}: field 'devices[{i}].fields' must be an object")
        for field in fields:
            if field not in DEVICE_FIELDS:
                raise ValueError(
                    f"NVML fixture {path}: unknown field 'devices[{i}].fields.{field}'"
                )
    return doc


def _answer(fields: dict[str, Any], field: str, source: str) -> Reading:
    if field not in fields:
        return Reading(None, f"not recorded in fixture {source}")
    value = fields[field]
    if isinstance(value, dict) and set(value) == {"nvml_error"}:
        return Reading(None, f"NVML: {value['nvml_error']}")
    return Reading(copy.deepcopy(value))


class SimulatedNvml:
    """NVML answers from a fixture; writes change the simulated state within the part's limits."""

    kind = "simulated"

    def __init__(
        self,
        doc: dict[str, Any],
        *,
        source: str = "fixture",
        root: bool = True,
        noop_writes: bool = False,
    ) -> None:
        self.source = source
        self.root = root
        self.noop_writes = noop_writes
        self._system = dict(doc.get("system", {}))
        self._devices = [copy.deepcopy(d["fields"]) for d in doc["devices"]]
        self._recorded = copy.deepcopy(self._devices)
        self._locks: list[dict[str, tuple[int, int]]] = [{} for _ in self._devices]

    @classmethod
    def from_fixture(
        cls,
        name_or_path: str | Path,
        *,
        root: bool = True,
        noop_writes: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> SimulatedNvml:
        """A device from a shipped fixture name (see `fixture_names()`) or a JSON path.

        `overrides` replaces device fields on every device (a fixture variant, e.g.
        {"pcie_link_width_current": 8}).
        """
        doc = load_fixture(name_or_path)
        for field, value in (overrides or {}).items():
            check_field(field)
            for device in doc["devices"]:
                device["fields"][field] = value
        return cls(doc, source=str(name_or_path), root=root, noop_writes=noop_writes)

    # Reads
    def device_count(self) -> int:
        return len(self._devices)

    def read(self, index: int, field: str) -> Reading:
        check_field(field)
        check_index(index, self.device_count())
        return _answer(self._devices[index], field, self.source)

    def read_system(self, field: str) -> Reading:
        if field not in SYSTEM_FIELDS:
            raise ValueError(f"unknown NVML system field {field!r}")
        return _answer(self._system, field, self.source)

    def close(self) -> None:
        return None

    def set_field(self, index: int, field: str, value: Any) -> None:
        """Change what a getter answers (a test's way to make the device throttle, heat, ...)."""
        check_field(field)
        check_index(index, self.device_count())
        self._devices[index][field] = copy.deepcopy(value)

    def locked_clocks(self, index: int) -> dict[str, tuple[int, int]]:
        """Locks in force ({"gpu"|"memory": (min, max)}); NVML has no getter for them."""
        check_index(index, self.device_count())
        return dict(self._locks[index])

    # Writes
    def _writable(self, index: int, what: str) -> dict[str, Any]:
        check_index(index, self.device_count())
        if not self.root:
            raise NvmlPermissionError(f"{what}: NVML: Insufficient Permissions (needs root)")
        return self._devices[index]

    def _known(self, fields: dict[str, Any], field: str, what: str) -> Any:
        reading = _answer(fields, field, self.source)
        if not reading.ok:
            raise NvmlNotSupportedError(f"{what}: cannot check against {field}: {reading.reason}")
        return reading.value

    def _set(self, fields: dict[str, Any], **values: Any) -> None:
        if not self.noop_writes:
            fields.update(values)

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        fields = self._writable(index, "persistence_mode")
        if not isinstance(enabled, bool):
            raise NvmlValueError(f"persistence_mode must be true or false, got {enabled!r}")
        self._known(fields, "persistence_mode", "persistence_mode")
        self._set(fields, persistence_mode=int(enabled))

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        fields = self._writable(index, "power_limit_mw")
        lo, hi = self._known(fields, "power_limit_constraints_mw", "power_limit_mw")
        _in_range("power_limit_mw", milliwatts, lo, hi)
        self._set(fields, power_limit_mw=milliwatts, power_limit_enforced_mw=milliwatts)

    def set_gpu_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        fields = self._writable(index, "gpu_locked_clocks")
        supported = self._known(fields, "supported_graphics_clocks_mhz", "gpu_locked_clocks")
        clocks = [c for values in supported.values() for c in values]
        _ordered("gpu_locked_clocks", min_mhz, max_mhz)
        for name, value in (("min_mhz", min_mhz), ("max_mhz", max_mhz)):
            _in_range(f"gpu_locked_clocks.{name}", value, min(clocks), max(clocks))
        if self.noop_writes:
            return
        self._locks[index]["gpu"] = (min_mhz, max_mhz)
        for domain in ("graphics", "sm"):
            self._clamp(fields, domain, min_mhz, max_mhz)
        self._reason_bit(index)

    def reset_gpu_locked_clocks(self, index: int) -> None:
        fields = self._writable(index, "gpu_locked_clocks")
        if self.noop_writes:
            return
        self._locks[index].pop("gpu", None)
        for domain in ("graphics", "sm"):
            self._restore(index, fields, f"clock_{domain}_current_mhz")
        self._reason_bit(index)

    def set_memory_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        fields = self._writable(index, "memory_locked_clocks")
        supported = self._known(fields, "supported_memory_clocks_mhz", "memory_locked_clocks")
        _ordered("memory_locked_clocks", min_mhz, max_mhz)
        for name, value in (("min_mhz", min_mhz), ("max_mhz", max_mhz)):
            _in_range(f"memory_locked_clocks.{name}", value, min(supported), max(supported))
        if self.noop_writes:
            return
        self._locks[index]["memory"] = (min_mhz, max_mhz)
        self._clamp(fields, "memory", min_mhz, max_mhz)
        self._reason_bit(index)

    def reset_memory_locked_clocks(self, index: int) -> None:
        fields = self._writable(index, "memory_locked_clocks")
        if self.noop_writes:
            return
        self._locks[index].pop("memory", None)
        self._restore(index, fields, "clock_memory_current_mhz")
        self._reason_bit(index)

    def set_applications_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        fields = self._writable(index, "applications_clocks")
        supported = self._known(fields, "supported_graphics_clocks_mhz", "applications_clocks")
        if str(memory_mhz) not in supported:
            raise NvmlValueError(
                f"applications_clocks.memory_mhz {memory_mhz} is not a supported memory clock "
                f"({', '.join(sorted(supported, key=int))})"
            )
        if graphics_mhz not in supported[str(memory_mhz)]:
            raise NvmlValueError(
                f"applications_clocks.graphics_mhz {graphics_mhz} is not supported at memory "
                f"clock {memory_mhz}"
            )
        self._set(
            fields,
            clock_memory_applications_mhz=memory_mhz,
            clock_graphics_applications_mhz=graphics_mhz,
            clock_sm_applications_mhz=graphics_mhz,
        )

    def reset_applications_clocks(self, index: int) -> None:
        fields = self._writable(index, "applications_clocks")
        if self.noop_writes:
            return
        for domain in ("memory", "graphics", "sm"):
            self._restore(index, fields, f"clock_{domain}_applications_mhz")

    def set_gpc_clk_vf_offset(self, index: int, offset_mhz: int) -> None:
        self._offset(index, "gpc_clk_vf_offset", offset_mhz)

    def set_mem_clk_vf_offset(self, index: int, offset_mhz: int) -> None:
        self._offset(index, "mem_clk_vf_offset", offset_mhz)

    def _offset(self, index: int, name: str, offset_mhz: int) -> None:
        field = f"{name}_mhz"
        fields = self._writable(index, field)
        lo, hi = self._known(fields, f"{name}_range_mhz", field)
        _in_range(field, offset_mhz, lo, hi)
        self._set(fields, **{field: offset_mhz})

    def _clamp(self, fields: dict[str, Any], domain: str, lo: int, hi: int) -> None:
        field = f"clock_{domain}_current_mhz"
        current = fields.get(field)
        if isinstance(current, int):
            fields[field] = min(max(current, lo), hi)

    def _restore(self, index: int, fields: dict[str, Any], field: str) -> None:
        if field in self._recorded[index]:
            fields[field] = copy.deepcopy(self._recorded[index][field])

    def _reason_bit(self, index: int) -> None:
        fields = self._devices[index]
        mask = fields.get("clock_event_reasons_current")
        if not isinstance(mask, int):
            return
        if self._locks[index]:
            fields["clock_event_reasons_current"] = mask | _APPLICATIONS_CLOCKS_BIT
        else:
            fields["clock_event_reasons_current"] = mask & ~_APPLICATIONS_CLOCKS_BIT


def _in_range(field: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise NvmlValueError(f"{field} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise NvmlValueError(f"{field} {value} outside the range the part reports [{lo}, {hi}]")


def _ordered(field: str, lo: Any, hi: Any) -> None:
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        raise NvmlValueError(f"{field}: min_mhz {lo} is above max_mhz {hi}")

"""Every setting a profile can change: read it, set it, read it back, put it back.

GPU settings go through an `NvmlBackend`; CPU settings are sysfs files under a
root folder ("/" on a host, a temporary tree in tests). `snapshot` gives the
JSON-ready old value that the journal stores before a change and that
`restore` puts back; `shown` turns it into the value a plan displays.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host_tuning.fact import list_dir, read_text, under
from host_tuning.nvml_base import POWER_REASONS, THERMAL_REASONS, NvmlBackend
from host_tuning.nvml_base import decode_clock_event_reasons as reasons_of

CPU = "/sys/devices/system/cpu"
# (file, True when the file says "no turbo", i.e. 1 means boost off)
BOOST_FILES = ((f"{CPU}/cpufreq/boost", False), (f"{CPU}/intel_pstate/no_turbo", True))


class SettingUnavailable(Exception):
    """This host cannot give or take the setting (not supported, not exposed); says why."""


@dataclass(frozen=True)
class Target:
    """Where a setting lives: GPU `index` of `backend`, or the CPU side under `cpu_root`."""

    backend: NvmlBackend | None
    index: int | None
    cpu_root: Path


@dataclass(frozen=True)
class Setting:
    """How to read, change, check and undo one setting (functions of a `Target`)."""

    name: str
    scope: str  # "gpu" or "cpu"
    unit: str  # for display: "W", "MHz" or ""
    snapshot: Callable[[Target], Any]  # raises SettingUnavailable
    shown: Callable[[Any], Any]  # snapshot -> value as a plan shows it
    write: Callable[[Target, Any], None]  # raises NvmlError or OSError
    verify: Callable[[Target, Any], str | None]  # None, or what reads back wrong
    restore: Callable[[Target, Any], None]  # put a snapshot back
    verify_restored: Callable[[Target, Any], str | None]


def nvml_value(target: Target, field: str) -> Any:
    """A device field of the target GPU; SettingUnavailable with NVML's reason when unreadable."""
    if target.backend is None or target.index is None:
        raise SettingUnavailable("no NVML")
    reading = target.backend.read(target.index, field)
    if not reading.ok:
        raise SettingUnavailable(f"cannot read {field}: {reading.reason}")
    return reading.value


# --- GPU settings with a getter ---------------------------------------------------


def _nvml_setting(
    name: str,
    field: str,
    setter: str,
    unit: str,
    to_nvml: Callable[[Any], Any],
    from_nvml: Callable[[Any], Any],
) -> Setting:
    def write(target: Target, value: Any) -> None:
        getattr(target.backend, setter)(target.index, to_nvml(value))

    def verify(target: Target, value: Any) -> str | None:
        got = nvml_value(target, field)
        if got == to_nvml(value):
            return None
        return f"{field} reads back {got!r}, expected {to_nvml(value)!r}"

    def restore(target: Target, snapshot: Any) -> None:
        write(target, from_nvml(snapshot))

    def verify_restored(target: Target, snapshot: Any) -> str | None:
        return verify(target, from_nvml(snapshot))

    return Setting(
        name,
        "gpu",
        unit,
        lambda target: nvml_value(target, field),
        from_nvml,
        write,
        verify,
        restore,
        verify_restored,
    )


def watts(milliwatts: int) -> int | float:
    """mW as W, an int when whole."""
    value = milliwatts / 1000
    return int(value) if value.is_integer() else value


def milliwatts(watts_value: float) -> int:
    return round(watts_value * 1000)


# --- locked clocks (NVML has no getter for them) ------------------------------------


def _lock_setting(name: str, domain: str, setter: str, resetter: str) -> Setting:
    field = f"clock_{domain}_current_mhz"

    def write(target: Target, value: Any) -> None:
        lo, hi = value
        getattr(target.backend, setter)(target.index, lo, hi)

    def verify(target: Target, value: Any) -> str | None:
        lo, hi = value
        current = nvml_value(target, field)
        if lo <= current <= hi:
            return None
        mask = target.backend.read(target.index, "clock_event_reasons_current").value
        names = reasons_of(mask) if isinstance(mask, int) else []
        held = set(names) & (POWER_REASONS | THERMAL_REASONS)
        if current < lo and held:
            return None  # locked, but power or heat holds the clock below the lock
        return f"{field} reads back {current} MHz, outside the lock [{lo}, {hi}]"

    def restore(target: Target, snapshot: Any) -> None:
        getattr(target.backend, resetter)(target.index)

    return Setting(
        name,
        "gpu",
        "MHz",
        lambda target: None,
        lambda snapshot: None,
        write,
        verify,
        restore,
        lambda target, snapshot: None,
    )


# --- CPU side (sysfs) ------------------------------------------------------------


def _write_sysfs(root: Path, path: str, text: str) -> None:
    with open(under(root, path), "w") as f:  # sysfs takes one write of the whole value
        f.write(text)


def _sysfs(root: Path, path: str) -> str:
    fact = read_text(root, path)
    if not fact.known:
        raise SettingUnavailable(fact.reason)
    return fact.value


def governor_files(root: Path) -> list[str]:
    """scaling_governor files of the CPUs that expose cpufreq, in CPU order."""
    cpus = [n for n in list_dir(root, CPU).value or [] if re.fullmatch(r"cpu\d+", n)]
    cpus.sort(key=lambda n: int(n[3:]))
    paths = [f"{CPU}/{cpu}/cpufreq/scaling_governor" for cpu in cpus]
    return [p for p in paths if under(root, p).is_file()]


def available_governors(root: Path) -> list[str] | None:
    """Governors the kernel offers (cpu0's list), or None when it does not say."""
    fact = read_text(root, f"{CPU}/cpu0/cpufreq/scaling_available_governors")
    return fact.value.split() if fact.known else None


def _governor_snapshot(target: Target) -> dict[str, str]:
    files = governor_files(target.cpu_root)
    if not files:
        raise SettingUnavailable(f"cpufreq not exposed (usual in VMs): no {CPU}/cpu*/cpufreq")
    return {path: _sysfs(target.cpu_root, path) for path in files}


def _governor_shown(snapshot: dict[str, str]) -> str:
    values = sorted(set(snapshot.values()))
    return values[0] if len(values) == 1 else "mixed: " + ", ".join(values)


def _governor_write(target: Target, governor: str) -> None:
    for path in governor_files(target.cpu_root):
        _write_sysfs(target.cpu_root, path, governor)


def _governor_verify(target: Target, governor: str) -> str | None:
    wrong = {p: v for p, v in _governor_snapshot(target).items() if v != governor}
    if not wrong:
        return None
    path, value = next(iter(wrong.items()))
    return f"{len(wrong)} CPU(s) read back another governor ({path}: {value})"


def _governor_restore(target: Target, snapshot: dict[str, str]) -> None:
    for path, governor in snapshot.items():
        if read_text(target.cpu_root, path).value != governor:
            _write_sysfs(target.cpu_root, path, governor)


def _governor_verify_restored(target: Target, snapshot: dict[str, str]) -> str | None:
    wrong = [p for p, v in snapshot.items() if read_text(target.cpu_root, p).value != v]
    return f"{len(wrong)} CPU(s) not back to their governor ({wrong[0]})" if wrong else None


def _boost_file(root: Path) -> tuple[str, bool]:
    for path, inverted in BOOST_FILES:
        if under(root, path).is_file():
            return path, inverted
    raise SettingUnavailable(f"no CPU boost control: neither {BOOST_FILES[0][0]} nor no_turbo")


def _boost_snapshot(target: Target) -> dict[str, Any]:
    path, inverted = _boost_file(target.cpu_root)
    return {"path": path, "inverted": inverted, "text": _sysfs(target.cpu_root, path)}


def _boost_shown(snapshot: dict[str, Any]) -> bool:
    return (snapshot["text"] == "1") != snapshot["inverted"]


def _boost_write(target: Target, on: bool) -> None:
    path, inverted = _boost_file(target.cpu_root)
    _write_sysfs(target.cpu_root, path, "1" if on != inverted else "0")


def _boost_verify(target: Target, on: bool) -> str | None:
    got = _boost_shown(_boost_snapshot(target))
    return None if got == on else f"boost reads back {'on' if got else 'off'}"


def _boost_restore(target: Target, snapshot: dict[str, Any]) -> None:
    _write_sysfs(target.cpu_root, snapshot["path"], snapshot["text"])


def _boost_verify_restored(target: Target, snapshot: dict[str, Any]) -> str | None:
    got = read_text(target.cpu_root, snapshot["path"]).value
    return None if got == snapshot["text"] else f"{snapshot['path']} reads {got!r}"


# --- the table ---------------------------------------------------------------------

GPU_SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        _nvml_setting(
            "persistence_mode", "persistence_mode", "set_persistence_mode", "", bool, bool
        ),
        _nvml_setting("power_limit_w", "power_limit_mw", "set_power_limit", "W", milliwatts, watts),
        _lock_setting(
            "memory_locked_clocks_mhz",
            "memory",
            "set_memory_locked_clocks",
            "reset_memory_locked_clocks",
        ),
        _lock_setting(
            "locked_clocks_mhz", "graphics", "set_gpu_locked_clocks", "reset_gpu_locked_clocks"
        ),
        _nvml_setting(
            "gpc_clk_vf_offset_mhz",
            "gpc_clk_vf_offset_mhz",
            "set_gpc_clk_vf_offset",
            "MHz",
            int,
            int,
        ),
        _nvml_setting(
            "mem_clk_vf_offset_mhz",
            "mem_clk_vf_offset_mhz",
            "set_mem_clk_vf_offset",
            "MHz",
            int,
            int,
        ),
    )
}
CPU_SETTINGS: dict[str, Setting] = {
    "governor": Setting(
        "governor",
        "cpu",
        "",
        _governor_snapshot,
        _governor_shown,
        _governor_write,
        _governor_verify,
        _governor_restore,
        _governor_verify_restored,
    ),
    "boost": Setting(
        "boost",
        "cpu",
        "",
        _boost_snapshot,
        _boost_shown,
        _boost_write,
        _boost_verify,
        _boost_restore,
        _boost_verify_restored,
    ),
}


def setting_for(label: str) -> tuple[Setting, int | None]:
    """The setting of a change label ("gpu0.power_limit_w", "cpu.governor") and its GPU index."""
    scope, _, name = label.partition(".")
    if scope == "cpu" and name in CPU_SETTINGS:
        return CPU_SETTINGS[name], None
    match = re.fullmatch(r"gpu(\d+)", scope)
    if match and name in GPU_SETTINGS:
        return GPU_SETTINGS[name], int(match.group(1))
    raise ValueError(f"unknown setting {label!r}")

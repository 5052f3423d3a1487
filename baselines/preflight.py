"""Pre-flight before measuring: is this GPU fit to be timed now, and pinning to its CPUs.

    result = preflight(0, profile="stable", policy="refuse")
    result.raise_if_refused()          # PreflightRefused listing what is wrong
    pin_to_gpu_local_cpus(0)           # the CPUs the process now runs on

Findings (codes): `other_processes` (another process has a context on the GPU),
`persistence_off`, `clock_lock_missing` (a lock the profile asks for is not in force),
`ecc_pending` / `mig_pending` (a mode change waits for a reset), `gpu_hot` (temperature within
`hot_margin_c` of the slowdown threshold, or a thermal slowdown active now), and `unchecked`
(something NVML could not tell, or no NVML at all). Each finding is "warn" or "refuse" by
`policy`, overridable per code with `per_finding` ("ignore" drops it); `unchecked` warns unless
overridden. Everything here only reads NVML and sysfs; nothing on the GPU is changed.

NVML has no getter for locked clocks: a lock counts as in force when the current clock lies
inside the locked range (within one clock step) and NVML shows the applications-clocks reason,
which the driver sets while clocks are locked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from host_tuning.fact import REAL_ROOT
from host_tuning.nvml import NvmlBackend, probe_nvml
from host_tuning.nvml_base import THERMAL_REASONS, decode_clock_event_reasons
from host_tuning.profiles import Profile, ProfileError, load_profile, plan

CODES = (
    "other_processes",
    "persistence_off",
    "clock_lock_missing",
    "ecc_pending",
    "mig_pending",
    "gpu_hot",
    "unchecked",
)
POLICIES = ("warn", "refuse")
SEVERITIES = ("warn", "refuse", "ignore")
DEFAULT_HOT_MARGIN_C = 10
LOCK_TOLERANCE_MHZ = 15  # one graphics clock step on current parts
_APPLICATIONS_CLOCKS = "applications_clocks_setting"


class PreflightRefused(Exception):
    """Pre-flight found something its policy refuses; the message lists it."""


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # "warn" or "refuse"
    message: str
    value: Any = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PreflightResult:
    device_index: int
    policy: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return any(f.severity == "refuse" for f in self.findings)

    @property
    def ok(self) -> bool:
        """Nothing found at all (not even a warning)."""
        return not self.findings

    def lines(self) -> list[str]:
        return [f"{f.severity}: {f.code}: {f.message}" for f in self.findings]

    def raise_if_refused(self) -> None:
        if self.refused:
            refused = [f"{f.code}: {f.message}" for f in self.findings if f.severity == "refuse"]
            raise PreflightRefused(
                f"GPU {self.device_index} is not fit to measure now: " + "; ".join(refused)
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_index": self.device_index,
            "policy": self.policy,
            "refused": self.refused,
            "findings": [f.to_dict() for f in self.findings],
        }


def _check_policy(policy: str, per_finding: Mapping[str, str] | None) -> dict[str, str]:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    severities = {code: policy for code in CODES}
    severities["unchecked"] = "warn"
    for code, severity in (per_finding or {}).items():
        if code not in CODES:
            raise ValueError(f"per_finding: unknown finding {code!r} (known: {', '.join(CODES)})")
        if severity not in SEVERITIES:
            raise ValueError(f"per_finding.{code} must be one of {SEVERITIES}, got {severity!r}")
        severities[code] = severity
    return severities


class _Checks:
    """Reads one GPU and collects findings."""

    def __init__(self, backend: NvmlBackend, index: int, severities: dict[str, str]) -> None:
        self.backend = backend
        self.index = index
        self.severities = severities
        self.findings: list[Finding] = []

    def add(self, code: str, message: str, value: Any = None) -> None:
        severity = self.severities[code]
        if severity != "ignore":
            self.findings.append(Finding(code, severity, message, value))

    def read(self, field_name: str) -> Any:
        """The field's value, or None after noting it as unchecked."""
        reading = self.backend.read(self.index, field_name)
        if not reading.ok:
            self.add("unchecked", f"{field_name}: {reading.reason}")
            return None
        return reading.value

    def processes(self) -> None:
        pids = self.read("compute_processes")
        if pids is None:
            return
        others = sorted(int(p) for p in pids if int(p) != os.getpid())
        if others:
            self.add(
                "other_processes",
                f"{len(others)} other process(es) use the GPU: pids {', '.join(map(str, others))}",
                others,
            )

    def persistence(self) -> None:
        mode = self.read("persistence_mode")
        if mode is not None and int(mode) == 0:
            self.add(
                "persistence_off",
                "persistence mode is off: the driver may tear the GPU state down between runs "
                "(clocks and first launches then vary)",
                0,
            )

    def pending(self, field_name: str, code: str, what: str) -> None:
        pair = self.read(field_name)
        if isinstance(pair, list | tuple) and len(pair) == 2 and pair[0] != pair[1]:
            self.add(
                code,
                f"{what} is {_on(pair[0])} but {_on(pair[1])} is pending (takes effect at the "
                "next GPU reset)",
                list(pair),
            )

    def temperature(self, margin_c: float) -> None:
        temp = self.read("temperature_c")
        limits = []
        for name in ("temperature_slowdown_c", "temperature_gpu_max_c"):
            reading = self.backend.read(self.index, name)
            if reading.ok and isinstance(reading.value, int | float) and reading.value > 0:
                limits.append((reading.value, name))
        mask = self.backend.read(self.index, "clock_event_reasons_current")
        reasons = decode_clock_event_reasons(int(mask.value)) if mask.ok else []
        thermal = sorted(set(reasons) & THERMAL_REASONS)
        if thermal:
            self.add("gpu_hot", f"thermal slowdown active now ({', '.join(thermal)})", temp)
            return
        if temp is None:
            return
        if not limits:
            self.add("unchecked", "no temperature threshold readable: cannot tell hot from cool")
            return
        limit, name = min(limits)
        if temp >= limit - margin_c:
            self.add(
                "gpu_hot",
                f"GPU at {temp} C, within {margin_c} C of its {name.removesuffix('_c')} "
                f"threshold {limit} C: clocks may drop while measuring",
                temp,
            )

    def locks(self, profile: Profile, cpu_root: Path) -> None:
        try:
            changes = plan(profile, self.backend, self.index, cpu_root=cpu_root)
        except ProfileError as err:
            self.add("unchecked", f"profile {profile.name}: {err}")
            return
        mask = self.backend.read(self.index, "clock_event_reasons_current")
        reasons = decode_clock_event_reasons(int(mask.value)) if mask.ok else None
        domains = {"locked_clocks_mhz": "sm", "memory_locked_clocks_mhz": "memory"}
        for change in changes:
            name = change.setting.split(".", 1)[-1]
            if name not in domains or change.status != "planned":
                continue
            lo, hi = change.after
            current = self.read(f"clock_{domains[name]}_current_mhz")
            if current is None:
                continue
            inside = lo - LOCK_TOLERANCE_MHZ <= current <= hi + LOCK_TOLERANCE_MHZ
            flagged = reasons is None or _APPLICATIONS_CLOCKS in reasons
            if not (inside and flagged):
                why = (
                    f"{domains[name]} clock {current} MHz"
                    if not inside
                    else "NVML does not show the applications-clocks reason"
                )
                self.add(
                    "clock_lock_missing",
                    f"profile {profile.name} locks {name} to [{lo}, {hi}] MHz but {why} "
                    "(apply it with `autotune host apply`)",
                    {"setting": name, "requested": [lo, hi], "current_mhz": current},
                )


def _on(value: Any) -> str:
    return "enabled" if value else "disabled"


def preflight(
    device_index: int = 0,
    *,
    profile: Profile | str | None = None,
    policy: str = "warn",
    nvml: NvmlBackend | None = None,
    per_finding: Mapping[str, str] | None = None,
    hot_margin_c: float = DEFAULT_HOT_MARGIN_C,
    cpu_root: Path = REAL_ROOT,
) -> PreflightResult:
    """Check NVML GPU `device_index` before measuring (module docstring for the findings).

    `profile` (a Profile, or a shipped name or path for `load_profile`) says which clock locks
    should be in force; None checks none. `nvml` defaults to the real library, opened and closed
    here. Raises ValueError for a bad policy, finding code, or device index; never for what the
    GPU cannot report (that is an `unchecked` finding)."""
    severities = _check_policy(policy, per_finding)
    if isinstance(hot_margin_c, bool) or not isinstance(hot_margin_c, int | float):
        raise ValueError(f"hot_margin_c must be a number, got {hot_margin_c!r}")
    if isinstance(profile, str | Path):
        profile = load_profile(profile)
    result = PreflightResult(device_index, policy)
    backend, owned = nvml, False
    if backend is None:
        probe = probe_nvml()
        if probe.backend is None:
            checks = _Checks(None, device_index, severities)  # type: ignore[arg-type]
            checks.add("unchecked", f"no NVML: {probe.reason}")
            result.findings = checks.findings
            return result
        backend, owned = probe.backend, True
    try:
        count = backend.device_count()
        if isinstance(device_index, bool) or not isinstance(device_index, int):
            raise ValueError(f"device_index must be an integer, got {device_index!r}")
        if not 0 <= device_index < count:
            raise ValueError(f"device_index {device_index} out of range: NVML sees {count} GPU(s)")
        checks = _Checks(backend, device_index, severities)
        checks.processes()
        checks.persistence()
        if profile is not None:
            checks.locks(profile, Path(cpu_root))
        checks.pending("ecc_mode", "ecc_pending", "ECC")
        checks.pending("mig_mode", "mig_pending", "MIG")
        checks.temperature(hot_margin_c)
        result.findings = checks.findings
    finally:
        if owned:
            backend.close()
    return result


# --- CPU pinning ----------------------------------------------------------------------------


def parse_cpulist(text: str) -> list[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]; ValueError naming the bad part."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"cpu list: bad part {part!r} in {text.strip()!r}") from None
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def _sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" -> sysfs's "0000:3b:00.0"."""
    domain, _, rest = str(nvml_bus_id).lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else str(nvml_bus_id).lower()


def gpu_local_cpus(
    device_index: int, nvml: NvmlBackend | None = None, *, sysfs_root: Path = REAL_ROOT
) -> list[int]:
    """CPUs close to the GPU: NVML's CPU affinity, else sysfs local_cpulist of its PCI device;
    [] when neither says."""
    backend, owned = nvml, False
    if backend is None:
        backend = probe_nvml().backend
        owned = backend is not None
    if backend is None:
        return []
    try:
        affinity = backend.read(device_index, "cpu_affinity")
        if affinity.ok and affinity.value:
            return sorted(int(c) for c in affinity.value)
        bus = backend.read(device_index, "pci_bus_id")
    finally:
        if owned:
            backend.close()
    if not bus.ok:
        return []
    path = Path(sysfs_root) / "sys/bus/pci/devices" / _sysfs_bus_id(bus.value) / "local_cpulist"
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return []


def pin_to_gpu_local_cpus(
    device_index: int, nvml: NvmlBackend | None = None, *, sysfs_root: Path = REAL_ROOT
) -> list[int]:
    """Pin every thread of this process to the CPUs local to GPU `device_index` that it may
    use; returns them, or [] (and leaves the affinity alone) when no local CPU is known or
    none of them is allowed here (a container's cpuset, say)."""
    allowed = os.sched_getaffinity(0)
    cpus = sorted(set(gpu_local_cpus(device_index, nvml, sysfs_root=sysfs_root)) & allowed)
    if not cpus:
        return []
    tasks = Path("/proc/self/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended meanwhile
    return cpus

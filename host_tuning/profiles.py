"""Tuning profiles: declarative JSON files validated by schemas/profile.schema.json, and plans.

Shipped profiles live in data/profiles (`list_profiles()`: stable, max, overclock);
a user profile loads from a path. `plan(profile, backend)` resolves one against a
GPU and the CPU side: every setting it names, from what to what, or why it is
skipped. Errors name the offending field: `profile.gpu.locked_clocks_mhz[1]: ...`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from host_tuning.fact import REAL_ROOT
from host_tuning.families import gpu_family
from host_tuning.jsonfile import read_json
from host_tuning.nvml_base import NvmlBackend
from host_tuning.settings import (
    CPU_SETTINGS,
    GPU_SETTINGS,
    SettingUnavailable,
    Target,
    available_governors,
    milliwatts,
    nvml_value,
    watts,
)

SCHEMA_ID = "autotune.host-profile/1"
PACKAGE = Path(__file__).parent
PROFILES_DIR = PACKAGE / "data" / "profiles"
SCHEMA_PATH = PACKAGE / "schemas" / "profile.schema.json"
STATUSES = ("planned", "skipped", "applied", "restored", "failed")
NO_LOCK_GETTER = "restore unlocks (NVML has no getter for locked clocks)"


class ProfileError(ValueError):
    """A profile that cannot be used here; the message names the file and the field."""


@dataclass(frozen=True)
class Profile:
    """A validated profile. GPU and CPU settings are keyed by setting name; None leaves one."""

    name: str
    description: str
    gpu: dict[str, Any]
    families: dict[str, dict[str, Any]]
    sustained_clocks_mhz: dict[str, int]
    cpu: dict[str, Any]
    source: str

    def gpu_setting(self, family: str, name: str) -> tuple[Any, str]:
        """The value of GPU setting `name` for a GPU family, and the profile field it came from."""
        override = self.families.get(family, {})
        if override.get(name) is not None:
            return override[name], f"{_path(['families', family])}.{name}"
        return self.gpu.get(name), f"profile.gpu.{name}"


@dataclass
class Change:
    """One row of a plan (and of the report's profile.changes)."""

    setting: str  # "gpu0.locked_clocks_mhz", "cpu.governor"
    before: Any
    after: Any
    status: str = "planned"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {"setting": self.setting, "before": self.before, "after": self.after}
        out["status"] = self.status
        if self.note:
            out["note"] = self.note
        return out


# --- loading ----------------------------------------------------------------------


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def _path(parts: list[Any] | tuple[Any, ...]) -> str:
    out = "profile"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _messages(error: ValidationError) -> list[str]:
    path = _path(list(error.absolute_path))
    if error.validator in ("anyOf", "oneOf"):
        deeper = [e for e in error.context or [] if len(e.absolute_path) > len(error.absolute_path)]
        if deeper:
            return _messages(best_match(deeper))
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        return [f"{path}.{name}: unknown field (known: {', '.join(known)})" for name in extra]
    if error.validator == "required":
        missing = [n for n in error.validator_value if n not in error.instance]
        return [f"{path}.{name}: missing (required)" for name in missing]
    description = error.schema.get("description")
    if description:
        return [f"{path}: {json.dumps(error.instance)} is not valid; expected {description}"]
    return [f"{path}: {error.message}"]


def validate_profile(doc: Any, source: str = "profile") -> Profile:
    """A Profile from a parsed JSON document; ProfileError lists every bad field."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    # jsonschema gives a `required` error per missing field, each naming the whole list
    messages = list(dict.fromkeys(m for error in errors for m in _messages(error)))
    if not messages:
        messages = _range_messages(doc)
    if messages:
        raise ProfileError(f"{source}: " + "; ".join(messages))
    gpu_names = list(GPU_SETTINGS)
    return Profile(
        name=doc["name"],
        description=doc["description"],
        gpu={name: doc["gpu"].get(name) for name in gpu_names},
        families={
            family: {name: settings.get(name) for name in gpu_names}
            for family, settings in doc.get("families", {}).items()
        },
        sustained_clocks_mhz=dict(doc.get("sustained_clocks_mhz", {})),
        cpu={name: doc["cpu"].get(name) for name in CPU_SETTINGS},
        source=source,
    )


def _range_messages(doc: dict[str, Any]) -> list[str]:
    sections = [(["gpu"], doc["gpu"])]
    sections += [(["families", f], s) for f, s in doc.get("families", {}).items()]
    messages = []
    for parts, section in sections:
        for name in ("locked_clocks_mhz", "memory_locked_clocks_mhz"):
            pair = section.get(name)
            if pair and all(isinstance(v, int) for v in pair) and pair[0] > pair[1]:
                messages.append(
                    f"{_path([*parts, name])}: min {pair[0]} MHz is above max {pair[1]} MHz"
                )
    return messages


def profile_names() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name (see `profile_names()`), or a profile file by path."""
    path = Path(name_or_path)
    if path.suffix != ".json" and not path.exists():
        path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ProfileError(
                f"unknown profile {str(name_or_path)!r}: shipped profiles are "
                f"{', '.join(profile_names())}, or give the path of a .json file"
            )
    return validate_profile(read_json(path, "profile", ProfileError), str(path))


def list_profiles() -> list[Profile]:
    """Every shipped profile, loaded and validated."""
    return [load_profile(name) for name in profile_names()]


# --- resolving a profile against a GPU ---------------------------------------------


@dataclass(frozen=True)
class _Gpu:
    """What resolution needs to know about one GPU."""

    target: Target
    label: str  # "gpu0"
    family: str
    profile: Profile
    memory_lock: list[int] | None = None


def _snap_down(value: int, clocks: list[int]) -> int:
    below = [c for c in clocks if c <= value]
    return max(below) if below else min(clocks)


def _check_in(path: str, value: float, lo: float, hi: float, what: str, unit: str) -> None:
    if value > hi:
        raise ProfileError(
            f"{path}: {value:g} {unit} is above the maximum of {what} ({hi:g} {unit})"
        )
    if value < lo:
        raise ProfileError(
            f"{path}: {value:g} {unit} is below the minimum of {what} ({lo:g} {unit})"
        )


def _power(gpu: _Gpu, value: Any, path: str) -> tuple[Any, str]:
    lo, hi = nvml_value(gpu.target, "power_limit_constraints_mw")
    symbolic = {"min": lo, "max": hi}
    if value == "default":
        symbolic["default"] = nvml_value(gpu.target, "power_limit_default_mw")
    if isinstance(value, str):
        return watts(symbolic[value]), f"{value}: {watts(symbolic[value]):g} W"
    mw = milliwatts(value)
    _check_in(path, value, watts(lo), watts(hi), "the power limit range the part allows", "W")
    return watts(mw), ""


def _memory_clocks(gpu: _Gpu) -> list[int]:
    return sorted(int(c) for c in nvml_value(gpu.target, "supported_memory_clocks_mhz"))


def _memory_lock(gpu: _Gpu, value: Any, path: str) -> tuple[Any, str]:
    clocks = _memory_clocks(gpu)
    out = []
    for i, v in enumerate(value):
        if v in ("min", "max"):
            out.append(clocks[0] if v == "min" else clocks[-1])
            continue
        _check_in(
            f"{path}[{i}]", v, clocks[0], clocks[-1], "the memory clocks this GPU supports", "MHz"
        )
        out.append(v)
    return _ordered(out, path), NO_LOCK_GETTER


def _graphics_clocks(gpu: _Gpu) -> list[int]:
    supported = nvml_value(gpu.target, "supported_graphics_clocks_mhz")
    memory = gpu.memory_lock[1] if gpu.memory_lock else max(int(m) for m in supported)
    clocks = supported.get(str(memory)) or [c for cs in supported.values() for c in cs]
    return sorted(clocks)


def _graphics_lock(gpu: _Gpu, value: Any, path: str) -> tuple[Any, str]:
    clocks = _graphics_clocks(gpu)
    notes = []
    out = []
    for i, v in enumerate(value):
        if v == "min":
            out.append(clocks[0])
        elif v == "max":
            out.append(clocks[-1])
        elif v == "default":
            out.append(
                _snap_down(
                    nvml_value(gpu.target, "clock_graphics_default_applications_mhz"), clocks
                )
            )
        elif v == "max-sustained":
            clock, note = _sustained(gpu, clocks)
            out.append(clock)
            notes.append(note)
        else:
            what = "the graphics clocks this GPU supports"
            _check_in(f"{path}[{i}]", v, clocks[0], clocks[-1], what, "MHz")
            out.append(v)
    return _ordered(out, path), "; ".join([*dict.fromkeys(notes), NO_LOCK_GETTER])


def _sustained(gpu: _Gpu, clocks: list[int]) -> tuple[int, str]:
    recorded = gpu.profile.sustained_clocks_mhz.get(gpu.family)
    if recorded is not None:
        clock = _snap_down(recorded, clocks)
        return clock, f"max-sustained for {gpu.family}: {clock} MHz"
    default = nvml_value(gpu.target, "clock_graphics_default_applications_mhz")
    clock = _snap_down(default, clocks)
    return clock, (
        f"no sustained clock recorded for {gpu.family} in profile {gpu.profile.name}: "
        f"max-sustained is the default applications clock, {clock} MHz"
    )


def _ordered(pair: list[int], path: str) -> list[int]:
    if pair[0] > pair[1]:
        raise ProfileError(f"{path}: min resolves to {pair[0]} MHz, above max {pair[1]} MHz")
    return pair


def _offset(name: str) -> Any:
    def resolve(gpu: _Gpu, value: Any, path: str) -> tuple[Any, str]:
        lo, hi = nvml_value(gpu.target, f"{name}_range_mhz")
        if lo == hi == 0:
            raise SettingUnavailable("the part reports an offset range of [0, 0]")
        _check_in(path, value, lo, hi, "the offset range the part reports", "MHz")
        return value, f"range [{lo}, {hi}] MHz"

    return resolve


_RESOLVE = {
    "persistence_mode": lambda gpu, value, path: (value, ""),
    "power_limit_w": _power,
    "memory_locked_clocks_mhz": _memory_lock,
    "locked_clocks_mhz": _graphics_lock,
    "gpc_clk_vf_offset_mhz": _offset("gpc_clk_vf_offset"),
    "mem_clk_vf_offset_mhz": _offset("mem_clk_vf_offset"),
}


def _plan_gpu(profile: Profile, backend: NvmlBackend, index: int, cpu_root: Path) -> list[Change]:
    target = Target(backend, index, cpu_root)
    gpu = _Gpu(target, f"gpu{index}", gpu_family(backend.read(index, "name").value), profile)
    changes = []
    for name, setting in GPU_SETTINGS.items():
        value, path = profile.gpu_setting(gpu.family, name)
        if value is None:
            continue
        label = f"{gpu.label}.{name}"
        before = None
        try:
            before = setting.shown(setting.snapshot(target))
            after, note = _RESOLVE[name](gpu, value, path)
        except SettingUnavailable as why:
            changes.append(
                Change(label, before, value, "skipped", f"not supported by this part: {why}")
            )
            continue
        if name == "memory_locked_clocks_mhz":
            gpu = replace(gpu, memory_lock=after)
        changes.append(
            _change(label, before, after, note, lockable=name.endswith("locked_clocks_mhz"))
        )
    return changes


def _change(label: str, before: Any, after: Any, note: str, lockable: bool = False) -> Change:
    if not lockable and before == after:
        return Change(label, before, after, "skipped", "already at this value")
    return Change(label, before, after, "planned", note)


def _plan_cpu(profile: Profile, cpu_root: Path) -> list[Change]:
    changes = []
    for name, setting in CPU_SETTINGS.items():
        value = profile.cpu.get(name)
        if value is None:
            continue
        label = f"cpu.{name}"
        target = Target(None, None, cpu_root)
        try:
            before = setting.shown(setting.snapshot(target))
        except SettingUnavailable as why:
            changes.append(
                Change(label, None, value, "skipped", f"not exposed on this host: {why}")
            )
            continue
        if name == "governor":
            offered = available_governors(cpu_root)
            if offered is not None and value not in offered:
                raise ProfileError(
                    f"{profile.source}: profile.cpu.governor: {value!r} is not offered by this "
                    f"kernel (available: {', '.join(offered)})"
                )
        changes.append(_change(label, before, value, ""))
    return changes


def plan(
    profile: Profile,
    backend: NvmlBackend | None,
    index: int | None = 0,
    *,
    cpu_root: Path = REAL_ROOT,
) -> list[Change]:
    """What applying `profile` would change on GPU `index` (None: every GPU) and the CPU side.

    Reads only. Settings the part lacks are "skipped" with the reason; a value
    outside what the part reports as allowed raises ProfileError naming the field.
    """
    changes: list[Change] = []
    if backend is not None:
        count = backend.device_count()
        if index is not None and not 0 <= index < count:
            have = f"GPUs 0 to {count - 1}" if count else "no GPU"
            raise ProfileError(f"no GPU {index}: NVML sees {have}")
        indices = range(count) if index is None else [index]
        for i in indices:
            try:
                changes += _plan_gpu(profile, backend, i, Path(cpu_root))
            except ProfileError as err:
                raise ProfileError(f"{profile.source}: gpu{i}: {err}") from None
    return changes + _plan_cpu(profile, Path(cpu_root))

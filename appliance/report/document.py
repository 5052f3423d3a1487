"""A report as readers use it: validated against its own schema version, then upgraded in memory
to the current version, so renderers, `verify` and `compare` only ever see one shape."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from appliance.report.schema import (
    SCHEMA_VERSION,
    ReportError,
    read_json_file,
    validate_report,
)

# Telemetry fields version 2 types; a version 1 report may hold others, which are dropped.
_V2_TELEMETRY = {
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "power_w",
    "throttle_reasons",
    "throttled_blocks",
    "remeasured_blocks",
    "samples",
    "remeasured",
}
V1_END_TO_END_WORKLOAD = "not recorded (schema v1 report)"


class InvalidReport(ValueError):
    """The document does not follow its schema; `errors` says where."""

    def __init__(self, errors: list[ReportError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"report is not valid ({len(errors)} errors):\n{lines}")


def checked(doc: Any) -> dict:
    """Validate `doc` against its schema version and return it upgraded to the current version
    (a copy); raises InvalidReport naming the failing paths."""
    errors = validate_report(doc)
    if errors:
        raise InvalidReport(errors)
    return upgrade(doc)


def load_report(path: str | Path) -> dict:
    """Read, validate and upgrade a report file; raises InvalidReport (file errors included)."""
    doc, errors = read_json_file(path)
    if errors:
        raise InvalidReport(errors)
    return checked(doc)


def upgrade(doc: dict) -> dict:
    """A copy of a valid report in the current schema version (version 2).

    Version 1 -> 2: `command` becomes `reproduce.command`; noise `ratios` become `samples`
    (one per A/A decision); an end-to-end ratio becomes the `combined` ratio of an end-to-end
    block next to the kernel and hardware gains; timing telemetry keeps its typed fields; the
    loop's honesty figures are summed from the tasks.
    """
    out = copy.deepcopy(doc)
    if out["schema_version"] == SCHEMA_VERSION:
        return out
    out["schema_version"] = "2"
    out["reproduce"] = {"command": out.pop("command")}
    noise = out.get("noise")
    if noise is not None and "ratios" in noise:
        noise["samples"] = noise.pop("ratios")
        noise["sample_unit"] = "decision"
    _upgrade_gains(out)
    for task in out["tasks"]:
        for shape in task["shapes"]:
            for timing in _timings(shape):
                if "telemetry" in timing:
                    timing["telemetry"] = {
                        k: v for k, v in timing["telemetry"].items() if k in _V2_TELEMETRY
                    }
    out["loop"]["proposals"] = proposals_from_tasks(out["tasks"])
    return _reorder(out)


def proposals_from_tasks(tasks: list[dict]) -> dict:
    """The loop's honesty figures summed over the report's tasks."""
    by_reason: dict[str, int] = {}
    for task in tasks:
        for code, n in task["rejected_by_reason"].items():
            by_reason[code] = by_reason.get(code, 0) + n
    tried = sum(t["trials"] for t in tasks)
    accepted = sum(t["accepted"] for t in tasks)
    out = {
        "tried": tried,
        "accepted": accepted,
        "rejected": tried - accepted,
        "rejected_by_reason": dict(sorted(by_reason.items())),
    }
    kept = [t.get("kept") for t in tasks]
    if tasks and all(k is not None for k in kept):
        out["kept"] = sum(kept)
    return out


def _upgrade_gains(out: dict) -> None:
    gains = out.get("gains")
    if not gains or gains.get("end_to_end") is None:
        return
    gains["end_to_end"] = {
        "workload": V1_END_TO_END_WORKLOAD,
        "tuned": {"kernels": "tuned kernels", "host": "tuned host"},
        "baseline": {"kernels": "peer kernels", "host": "untuned host"},
        "combined": gains["end_to_end"],
        "kernel_only": gains.get("kernel"),
        "hardware_only": gains.get("hardware"),
    }


def _timings(shape: dict) -> list[dict]:
    found = list(shape["peers"].values())
    if shape["incumbent"] is not None:
        found.append(shape["incumbent"])
    if shape["winner"] is not None:
        found.append(shape["winner"]["timing"])
    return found


def _reorder(out: dict) -> dict:
    first = ["schema_version", "created", "reproduce"]
    return {**{k: out[k] for k in first}, **{k: v for k, v in out.items() if k not in first}}

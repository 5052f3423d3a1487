"""Load the versioned report schemas and validate report documents against them.

Each schema version is a file under `schemas/`; `SCHEMA_FILES` maps a report's
`schema_version` to its file, so reports written by older versions stay readable
(`appliance.report.upgrade` turns them into the current version in memory).
Errors name the JSON path that failed, never raise a traceback for bad input.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

SCHEMA_VERSION = "2"
SCHEMA_FILES: dict[str, str] = {
    "1": "report-v1.schema.json",
    "2": "report-v2.schema.json",
}

ROOT = "(root)"
FILE = "(file)"


@dataclass(frozen=True)
class ReportError:
    """One problem with a report: the JSON path (slash-separated) and what is wrong there."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def load_schema(version: str = SCHEMA_VERSION) -> dict:
    """Return the JSON Schema for report `version` (a fresh copy the caller may modify)."""
    return copy.deepcopy(_schema(version))


@functools.cache
def _schema(version: str) -> dict:
    if version not in SCHEMA_FILES:
        known = ", ".join(sorted(SCHEMA_FILES))
        raise ValueError(f"unknown report schema version {version!r}; known: {known}")
    text = (
        resources.files(__package__).joinpath("schemas", SCHEMA_FILES[version]).read_text("utf-8")
    )
    return json.loads(text)


@functools.cache
def _validator(version: str) -> Draft202012Validator:
    return Draft202012Validator(
        _schema(version), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def validate_report(doc: Any) -> list[ReportError]:
    """Validate a parsed report; an empty list means it is valid."""
    if not isinstance(doc, dict):
        return [ReportError(ROOT, f"a report is a JSON object, got {_json_type(doc)}")]
    version = doc.get("schema_version")
    if version is None:
        return [ReportError("schema_version", "required field is missing")]
    if not isinstance(version, str) or version not in SCHEMA_FILES:
        known = ", ".join(repr(v) for v in sorted(SCHEMA_FILES))
        return [
            ReportError(
                "schema_version", f"unknown schema version {version!r}; this autotune reads {known}"
            )
        ]
    try:
        errors = _unusable_values(doc, [])
        for error in _validator(version).iter_errors(doc):
            errors.extend(_explain(error))
    except RecursionError:
        return [ReportError(ROOT, "nested too deep to be a report")]
    if not errors:
        errors.extend(_semantic_errors(doc))
    return sorted(set(errors), key=lambda e: (e.path, e.message))


def validate_file(path: str | Path) -> list[ReportError]:
    """Read and validate a report file; unreadable or non-JSON files are errors too."""
    doc, errors = read_json_file(path)
    return errors or validate_report(doc)


def read_json_file(path: str | Path) -> tuple[Any, list[ReportError]]:
    """Parse a JSON file: (document, []) or (None, [the file-level error])."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO or a device would block the read
        return None, [ReportError(FILE, f"cannot read {path}: not a regular file")]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, [ReportError(FILE, f"{path} is not UTF-8 text")]
    except OSError as exc:
        return None, [ReportError(FILE, f"cannot read {path}: {exc.strerror or exc}")]
    try:
        return json.loads(text, parse_constant=_reject_constant), []
    except json.JSONDecodeError as exc:
        where = f"(line {exc.lineno}, column {exc.colno})"
        return None, [ReportError(FILE, f"{path} is not JSON: {exc.msg} {where}")]
    except ValueError as exc:
        return None, [ReportError(FILE, f"{path} is not JSON: {exc}")]
    except RecursionError:
        return None, [ReportError(FILE, f"{path} is nested too deep to be a report")]


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _explain(error: ValidationError) -> list[ReportError]:
    """Turn one jsonschema error into errors that point at the offending field."""
    base = list(error.absolute_path)
    if error.validator == "required":
        missing = [n for n in error.validator_value if n not in error.instance]
        named = [n for n in missing if repr(n) in error.message] or missing
        return [ReportError(_path([*base, n]), "required field is missing") for n in named]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in known]
        return [ReportError(_path([*base, k]), "unexpected field") for k in extra]
    if error.validator in ("anyOf", "oneOf") and error.context:
        deeper = _errors_of_matching_branch(error)
        if deeper:
            return [e for sub in deeper for e in _explain(sub)]
        allowed = _branch_types(error.validator_value)
        return [ReportError(_path(base), f"expected {allowed}, got {_json_type(error.instance)}")]
    if error.validator == "pattern" and "description" in error.schema:
        return [
            ReportError(_path(base), f"{error.instance!r} is not {error.schema['description']}")
        ]
    return [ReportError(_path(base), error.message)]


def _errors_of_matching_branch(error: ValidationError) -> list[ValidationError]:
    """Errors from the branches of an anyOf whose type the value has (e.g. the object, not null)."""
    by_branch: dict[int, list[ValidationError]] = {}
    for sub in error.context:
        by_branch.setdefault(sub.schema_path[0], []).append(sub)
    picked = []
    for subs in by_branch.values():
        wrong_type = any(s.validator == "type" and not s.relative_path for s in subs)
        if not wrong_type:
            picked.extend(subs)
    return picked


def _branch_types(branches: list[dict]) -> str:
    names = []
    for branch in branches:
        if "$ref" in branch:
            names.append(branch["$ref"].rsplit("/", 1)[-1])
        elif "type" in branch:
            names.append(str(branch["type"]))
    return " or ".join(names) or "one of the allowed forms"


# Beyond any quantity a report measures (times, bytes, FLOPs, ratios): larger numbers only
# overflow the renderers' arithmetic.
LARGEST_NUMBER = 1e100


def _unusable_values(value: Any, where: list) -> list[ReportError]:
    """Numbers that are not finite or beyond LARGEST_NUMBER, and strings that are not valid
    Unicode (a lone surrogate), which no renderer can write."""
    if isinstance(value, float) and not math.isfinite(value):
        return [ReportError(_path(where), f"{value} is not a finite number")]
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and abs(value) > LARGEST_NUMBER
    ):
        return [ReportError(_path(where), f"the number is beyond {LARGEST_NUMBER:.0e}")]
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return [ReportError(_path(where), "the text is not valid Unicode (a lone surrogate)")]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _unusable_values(v, [*where, k])]
    if isinstance(value, list):
        return [e for i, v in enumerate(value) for e in _unusable_values(v, [*where, i])]
    return []


def _semantic_errors(doc: dict) -> list[ReportError]:
    """Checks JSON Schema cannot express: intervals in order, dispatch peers that exist."""
    errors: list[ReportError] = []
    for i, metric in enumerate(doc["baselines"]["metrics"]):
        if metric["ci_low"] is not None and metric["ci_high"] is not None:
            errors += _interval(["baselines", "metrics", i], metric, "value", "ci_low", "ci_high")
    noise = doc["noise"]
    if noise is not None:
        lo, hi = noise["aa_ratio_ci"]
        if lo > hi:
            errors.append(ReportError("noise/aa_ratio_ci", f"low end {lo} is above high end {hi}"))
    seen_tasks: set[tuple[str, str]] = set()
    for t, task in enumerate(doc["tasks"]):
        base = ["tasks", t]
        key = (task["task"], task["device"])
        if key in seen_tasks:  # claims and re-measurements are keyed by task and shape name
            errors.append(ReportError(_path([*base, "task"]), f"task {key[0]!r} on {key[1]} twice"))
        seen_tasks.add(key)
        peer_names = set()
        shape_names: set[str] = set()
        for s, shape in enumerate(task["shapes"]):
            where = [*base, "shapes", s]
            if shape["name"] in shape_names:
                errors.append(
                    ReportError(_path([*where, "name"]), f"shape {shape['name']!r} appears twice")
                )
            shape_names.add(shape["name"])
            peer_names.update(shape["peers"])
            for name, timing in shape["peers"].items():
                errors += _timing_interval([*where, "peers", name], timing)
            if shape["incumbent"] is not None:
                errors += _timing_interval([*where, "incumbent"], shape["incumbent"])
            winner = shape["winner"]
            if winner is not None:
                errors += _timing_interval([*where, "winner", "timing"], winner["timing"])
                speedup = winner["speedup_vs_best_peer"]
                if speedup is not None:
                    at = [*where, "winner", "speedup_vs_best_peer"]
                    errors += _ratio_interval(at, speedup)
        for d, entry in enumerate(task["dispatch"]):
            if entry["source"] == "peer" and entry["candidate"] not in peer_names:
                errors.append(
                    ReportError(
                        _path([*base, "dispatch", d, "candidate"]),
                        f"peer {entry['candidate']!r} was not measured on any shape of this task",
                    )
                )
    errors += _gain_errors(doc)
    if doc["schema_version"] != "1":
        errors += _v2_errors(doc)
    return errors


def _gain_errors(doc: dict) -> list[ReportError]:
    errors: list[ReportError] = []
    for name, gain in (doc.get("gains") or {}).items():
        if gain is None:
            continue
        if name == "end_to_end" and doc["schema_version"] != "1":
            for part in ("combined", "kernel_only", "hardware_only"):
                if gain[part] is not None:
                    errors += _ratio_interval(["gains", name, part], gain[part])
        else:
            errors += _ratio_interval(["gains", name], gain)
    return errors


def _v2_errors(doc: dict) -> list[ReportError]:
    """Version 2 blocks: intervals of the new ratios, and honesty figures that add up."""
    errors: list[ReportError] = []
    for t, task in enumerate(doc["tasks"]):
        for s, shape in enumerate(task["shapes"]):
            where = ["tasks", t, "shapes", s]
            if shape.get("incumbent_speedup_vs_best_peer"):
                at = [*where, "incumbent_speedup_vs_best_peer"]
                errors += _ratio_interval(at, shape["incumbent_speedup_vs_best_peer"])
            best = shape.get("best_peer")
            if best is not None and best not in shape["peers"]:
                errors.append(
                    ReportError(_path([*where, "best_peer"]), f"peer {best!r} has no timing here")
                )
    comparison = doc["baselines"].get("comparison")
    for m, metric in enumerate((comparison or {}).get("metrics", [])):
        errors += _ratio_interval(["baselines", "comparison", "metrics", m], metric)
    proposals = doc["loop"].get("proposals")
    if proposals is not None:
        errors += _proposal_errors(proposals)
    return errors


def _proposal_errors(p: dict) -> list[ReportError]:
    errors = []
    if p["accepted"] + p["rejected"] > p["tried"]:
        errors.append(
            ReportError(
                "loop/proposals",
                f"accepted {p['accepted']} + rejected {p['rejected']} exceeds tried {p['tried']}",
            )
        )
    if p.get("kept") is not None and p["kept"] > p["accepted"]:
        errors.append(
            ReportError("loop/proposals/kept", f"kept {p['kept']} exceeds accepted {p['accepted']}")
        )
    counted = sum(p["rejected_by_reason"].values())
    if counted < p["rejected"]:
        errors.append(
            ReportError(
                "loop/proposals/rejected_by_reason",
                f"reason counts add up to {counted}, fewer than the {p['rejected']} rejected",
            )
        )
    return errors


def _ratio_interval(where: list, obj: dict) -> list[ReportError]:
    return _interval(where, obj, "ratio", "ci_low", "ci_high")


def _timing_interval(where: list, timing: dict) -> list[ReportError]:
    if timing["ci_low_s"] <= 0:
        return [ReportError(_path([*where, "ci_low_s"]), "a time must be above 0 s")]
    return _interval(where, timing, "median_s", "ci_low_s", "ci_high_s")


def _interval(where: list, obj: dict, mid: str, low: str, high: str) -> list[ReportError]:
    if obj[low] <= obj[mid] <= obj[high]:
        return []
    return [
        ReportError(
            _path(where),
            f"interval out of order: {low} {obj[low]} <= {mid} {obj[mid]} <= {high} {obj[high]} fails",
        )
    ]


def _path(parts: list) -> str:
    return "/".join(str(p) for p in parts) or ROOT


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__

"""`autotune host check`: facts and checks as one JSON-ready dict, and as a rich table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from host_tuning.checks import CheckResult, run_checks
from host_tuning.facts import HostFacts, gather_facts
from host_tuning.nvml_base import NvmlBackend

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}
IDENTIFYING_FIELDS = ("uuid", "serial")


def _note(facts: HostFacts, checks: list[CheckResult]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in STATUS_STYLE}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if facts.gpus:
        names = sorted({str(g.get("name").value) for g in facts.gpus})
        return f"{len(facts.gpus)} GPU(s) ({', '.join(names)}): {summary}"
    driver = next(c for c in checks if c.id == "gpu.driver")
    return f"{driver.message}. Host checks only: {summary}"


def _redacted(facts: dict[str, Any]) -> dict[str, Any]:
    for gpu in facts["gpus"]:
        for name in IDENTIFYING_FIELDS:
            if gpu["nvml"][name]["value"] is not None:
                gpu["nvml"][name]["value"] = "REDACTED"
    return facts


def host_report(nvml: NvmlBackend | None = None, *, redact: bool = True) -> dict[str, Any]:
    """Facts of this host and the checks on them, ready for json.dumps.

    With `nvml` None the real NVML is tried; without a driver the report still
    answers, with gpu_present False and the reason in `note`. GPU UUIDs and serial
    numbers are replaced by "REDACTED" unless `redact` is False.
    """
    facts = gather_facts(nvml)
    checks = run_checks(facts)
    plain = facts.to_dict()
    return {
        "facts": _redacted(plain) if redact else plain,
        "checks": [c.to_dict() for c in checks],
        "gpu_present": bool(facts.gpus),
        "note": _note(facts, checks),
    }


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def render_checks_table(checks: list[CheckResult] | list[dict[str, Any]]) -> Table:
    """A rich table of check results (CheckResult objects or their dicts)."""
    table = Table(title="Host checks", show_lines=False)
    for column in ("status", "check", "subject", "actual", "recommended", "needs", "message"):
        table.add_column(column, overflow="fold")
    for check in checks:
        row = check if isinstance(check, dict) else check.to_dict()
        status = row["status"]
        table.add_row(
            f"[{STATUS_STYLE.get(status, '')}]{status}[/]",
            row["id"],
            row["subject"],
            _cell(row["actual"]),
            _cell(row["recommended"]),
            "" if row["needs"] == "none" else row["needs"],
            row["message"] + (f". Fix: {row['fix']}" if row["fix"] else ""),
        )
    return table

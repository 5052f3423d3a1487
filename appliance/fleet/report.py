"""The fleet report: one row per host (GPU, driver, PCIe link, clocks, baselines, host status)
with the outliers flagged: a link below its maximum, a bandwidth under 90 % of the fleet
median, throttling, failed checks, and hosts that did not answer."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

BANDWIDTH_FRACTION = 0.9
THROTTLE_CHECK = "gpu.clock_events"


@dataclass
class HostInput:
    """What is known of one host: its `autotune host check` JSON and baseline JSON, if any."""

    name: str
    status: str = "ok"
    reason: str = ""
    check: dict | None = None
    baseline: dict | None = None


@dataclass
class HostRow:
    name: str
    status: str
    reason: str
    gpu: str = "-"
    driver: str = "-"
    link: str = "-"
    clocks: str = "-"
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed_checks: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.name,
            "status": self.status,
            "reason": self.reason,
            "gpu": self.gpu,
            "driver": self.driver,
            "link": self.link,
            "clocks": self.clocks,
            "baselines": self.metrics,
            "failed_checks": self.failed_checks,
            "flags": self.flags,
        }


@dataclass
class FleetReport:
    rows: list[HostRow]
    medians: dict[str, float]

    @property
    def outliers(self) -> list[str]:
        return [r.name for r in self.rows if r.flags]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "autotune.fleet-report/1",
            "hosts": [r.to_dict() for r in self.rows],
            "fleet_medians": self.medians,
            "outliers": self.outliers,
        }


def fleet_report(hosts: list[HostInput]) -> FleetReport:
    """Rows for every host, then the fleet-wide comparison of bandwidths."""
    rows = [_row(h) for h in hosts]
    medians = _medians(rows)
    for row in rows:
        for name, median in medians.items():
            metric = row.metrics.get(name)
            if metric and metric["value"] < BANDWIDTH_FRACTION * median:
                row.flags.append(
                    f"{name} {metric['value']:.3g} {metric['unit']} is under 90 % of the "
                    f"fleet median {median:.3g}"
                )
    return FleetReport(rows, medians)


def _row(h: HostInput) -> HostRow:
    row = HostRow(h.name, h.status, h.reason)
    if h.status != "ok":
        row.flags.append(f"{h.status}: {h.reason}")
    if h.check:
        _facts(row, h.check)
    if h.baseline:
        for metric in h.baseline.get("metrics", []):
            if metric.get("value") is not None:
                row.metrics[metric["name"]] = {
                    "value": metric["value"],
                    "unit": metric.get("unit", ""),
                    "higher_is_better": metric.get("higher_is_better", True),
                }
    return row


def _facts(row: HostRow, check: dict) -> None:
    facts = check.get("facts", {})
    gpus = facts.get("gpus", [])
    row.driver = str(_value(facts.get("driver", {}).get("driver_version")) or "-")
    if gpus:
        names = sorted({str(_nvml(g, "name")) for g in gpus})
        row.gpu = f"{len(gpus)}x {', '.join(names)}"
        row.link = _links(row, gpus)
        row.clocks = _clocks(gpus[0])
    else:
        row.gpu = "none"
    checks = check.get("checks", [])
    row.failed_checks = sorted({c["id"] for c in checks if c.get("status") == "fail"})
    if row.failed_checks:
        row.flags.append(f"failed checks: {', '.join(row.failed_checks)}")
    throttled = [
        f"{c['subject']} {c['actual']}"
        for c in checks
        if c.get("id") == THROTTLE_CHECK and c.get("status") in ("warn", "fail")
    ]
    if throttled:
        row.flags.append(f"throttling: {'; '.join(throttled)}")


def _links(row: HostRow, gpus: list[dict]) -> str:
    shown = []
    for gpu in gpus:
        gen, gen_max = _nvml(gpu, "pcie_link_gen_current"), _nvml(gpu, "pcie_link_gen_max")
        width, width_max = (
            _nvml(gpu, "pcie_link_width_current"),
            _nvml(gpu, "pcie_link_width_max"),
        )
        text = f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"
        below = []
        if None not in (gen, gen_max) and gen < gen_max:
            below.append(f"Gen{gen} of Gen{gen_max}")
        if None not in (width, width_max) and width < width_max:
            below.append(f"x{width} of x{width_max}")
        if below:
            row.flags.append(
                f"gpu{gpu.get('index', '?')} link below its maximum: {', '.join(below)}"
            )
            text += f" (max Gen{gen_max} x{width_max})"
        shown.append(text)
    distinct = sorted(set(shown))
    return distinct[0] if len(distinct) == 1 else "; ".join(shown)


def _clocks(gpu: dict) -> str:
    sm, sm_max = _nvml(gpu, "clock_sm_current_mhz"), _nvml(gpu, "clock_sm_max_mhz")
    mem, mem_max = _nvml(gpu, "clock_memory_current_mhz"), _nvml(gpu, "clock_memory_max_mhz")
    return f"SM {sm}/{sm_max} MHz, mem {mem}/{mem_max} MHz"


def _medians(rows: list[HostRow]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for row in rows:
        for name, metric in row.metrics.items():
            if metric["unit"] == "GB/s" and metric["higher_is_better"]:
                values.setdefault(name, []).append(float(metric["value"]))
    return {name: statistics.median(v) for name, v in values.items() if len(v) >= 2}


def _nvml(gpu: dict, name: str) -> Any:
    return _value(gpu.get("nvml", {}).get(name))


def _value(fact: Any) -> Any:
    return fact.get("value") if isinstance(fact, dict) else fact


def render_table(report: FleetReport, title: str = "Fleet") -> Table:
    """The report as a rich table: one row per host, flags in the last column."""
    table = Table(title=title, show_lines=True)
    names = sorted({n for r in report.rows for n in r.metrics})
    for col in ("host", "status", "GPU", "driver", "link", "clocks", *names, "flags"):
        table.add_column(col, overflow="fold")
    for row in report.rows:
        status = "[green]ok[/green]" if row.status == "ok" else f"[red]{row.status}[/red]"
        cells = [_metric_cell(row.metrics.get(n)) for n in names]
        flags = "\n".join(row.flags) or ""
        table.add_row(
            row.name,
            status,
            row.gpu,
            row.driver,
            row.link,
            row.clocks,
            *cells,
            f"[yellow]{flags}[/yellow]" if flags else "",
        )
    return table


def render_markdown(report: FleetReport) -> str:
    """The same table in Markdown, for the collected run directory."""
    names = sorted({n for r in report.rows for n in r.metrics})
    head = ["host", "status", "GPU", "driver", "link", "clocks", *names, "flags"]
    lines = [
        "# Fleet report",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in report.rows:
        cells = [
            row.name,
            row.status,
            row.gpu,
            row.driver,
            row.link,
            row.clocks,
            *(_metric_cell(row.metrics.get(n)) for n in names),
            "; ".join(row.flags),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", f"Outliers: {', '.join(report.outliers) or 'none'}", ""]
    return "\n".join(lines)


def _metric_cell(metric: dict | None) -> str:
    return f"{metric['value']:.4g} {metric['unit']}" if metric else "-"

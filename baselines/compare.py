"""Two baselines side by side (bare metal versus a VM, say): per-metric ratios with intervals.

Ratios are direction aware: `ratio` is how many times better A is than B on that metric (A's
rate over B's for a rate, B's latency over A's for a latency), so above 1 always means A is
better. Summary lines name the better side: "bare metal 1.18x [1.15, 1.21] on launch latency".

The interval of a ratio comes from the two metrics' own 95 % intervals, without a bootstrap
(the raw blocks are not in a baseline file). On the log scale each side's interval is read as
median -/+ 1.96 sigma, separately below and above the median (bootstrap intervals are not
symmetric), and the two independent runs' deviations add in quadrature:

    ln r  = ln g_A - ln g_B                      (g: the metric, inverted for a latency)
    low   = ln r - sqrt(dlow_A^2 + dhigh_B^2)    (A at its worst, B at its best)
    high  = ln r + sqrt(dhigh_A^2 + dlow_B^2)    (dlow = ln g - ln g_low, dhigh = ln g_high - ln g)

A side without an interval (n = 1, as in a reference file made from single numbers) adds
nothing, so the ratio's interval is only the other side's; the comparison notes it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from baselines.stats import RatioInterval, decide
from baselines.suite import BaselineResult, Metric
from host_tuning.jsonfile import read_json

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_MIN_EFFECT = 0.01
VERDICTS = {"faster": "A better", "slower": "B better", "same": "same", "ambiguous": "ambiguous"}


@dataclass(frozen=True)
class MetricComparison:
    name: str
    title: str
    unit: str
    higher_is_better: bool
    a: Metric
    b: Metric
    ratio: float  # how many times better A is than B (> 1: A better)
    ci_low: float
    ci_high: float
    verdict: str  # "A better", "B better", "same", "ambiguous"
    no_interval: list[str] = field(default_factory=list)  # "A"/"B": sides with n == 1

    @property
    def a_better(self) -> bool:
        return self.ratio >= 1.0

    def factor(self) -> tuple[float, float, float]:
        """How many times better the better side is, with its interval (all >= 1 when clear)."""
        if self.a_better:
            return self.ratio, self.ci_low, self.ci_high
        return 1 / self.ratio, 1 / self.ci_high, 1 / self.ci_low

    def line(self, label_a: str, label_b: str) -> str:
        """ "bare metal 1.18x [1.15, 1.21] on launch latency"."""
        value, low, high = self.factor()
        better = label_a if self.a_better else label_b
        digits = 2 if f"{low:.2f}" != f"{high:.2f}" else 3  # enough to show the interval
        return f"{better} {value:.{digits}f}x [{low:.{digits}f}, {high:.{digits}f}] on {self.title}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["a"], out["b"] = self.a.to_dict(), self.b.to_dict()
        return out


@dataclass(frozen=True)
class Comparison:
    label_a: str
    label_b: str
    metrics: list[MetricComparison]
    summary: str
    lines: list[str]
    notes: list[str]
    min_effect: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "label_a": self.label_a,
            "label_b": self.label_b,
            "summary": self.summary,
            "lines": list(self.lines),
            "notes": list(self.notes),
            "min_effect": self.min_effect,
            "metrics": [m.to_dict() for m in self.metrics],
        }


def _goodness(m: Metric) -> tuple[float, float, float]:
    """(value, low, high) on a scale where higher is better."""
    if m.higher_is_better:
        return m.value, m.ci_low, m.ci_high
    return 1 / m.value, 1 / m.ci_high, 1 / m.ci_low


def ratio_from_intervals(a: Metric, b: Metric) -> tuple[float, float, float]:
    """A over B on the better-is-higher scale, with the propagated interval (module docstring)."""
    ga, la, ha = _goodness(a)
    gb, lb, hb = _goodness(b)
    log_r = math.log(ga) - math.log(gb)
    down = math.hypot(math.log(ga) - math.log(la), math.log(hb) - math.log(gb))
    up = math.hypot(math.log(ha) - math.log(ga), math.log(gb) - math.log(lb))
    return math.exp(log_r), math.exp(log_r - down), math.exp(log_r + up)


def _labels(
    a: BaselineResult, b: BaselineResult, labels: tuple[str, str] | None
) -> tuple[str, str]:
    if labels is not None:
        if len(labels) != 2 or not all(isinstance(x, str) and x for x in labels):
            raise ValueError("labels must be two non-empty strings")
        return labels
    la, lb = a.environment.label, b.environment.label
    if la == lb:
        return f"A ({la})", f"B ({lb})"
    return la, lb


def compare_baselines(
    a: dict[str, Any],
    b: dict[str, Any],
    labels: tuple[str, str] | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
) -> Comparison:
    """Compare baseline A with baseline B (suite `to_dict()` documents or reference files).

    Labels default to the environments ("bare metal", "VM (GPU passthrough)", ...). A verdict
    needs the whole interval beyond 1 + `min_effect` (stats.decide). Metrics found on one side
    only, or measured differently, are left out with a note. Raises ValueError naming the
    offending field of a malformed document ("A.metrics[2].ci_low ...")."""
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect!r}")
    base_a = BaselineResult.from_dict(a, where="A")
    base_b = BaselineResult.from_dict(b, where="B")
    label_a, label_b = _labels(base_a, base_b, labels)
    notes: list[str] = []
    rows: list[MetricComparison] = []
    for ma in base_a.metrics:
        mb = base_b.metric(ma.name)
        if mb is None:
            notes.append(f"{ma.title or ma.name}: only in A")
            continue
        if ma.unit != mb.unit or ma.higher_is_better != mb.higher_is_better:
            notes.append(f"{ma.name}: not comparable (A in {ma.unit}, B in {mb.unit})")
            continue
        if ma.title and mb.title and ma.title != mb.title:
            notes.append(f"{ma.name}: measured differently (A: {ma.title}; B: {mb.title})")
        ratio, low, high = ratio_from_intervals(ma, mb)
        verdict = decide(RatioInterval(ratio, low, high, min(ma.n, mb.n), math.nan), min_effect)
        rows.append(
            MetricComparison(
                name=ma.name,
                title=ma.title or ma.name,
                unit=ma.unit,
                higher_is_better=ma.higher_is_better,
                a=ma,
                b=mb,
                ratio=ratio,
                ci_low=low,
                ci_high=high,
                verdict=VERDICTS[verdict],
                no_interval=[side for side, m in (("A", ma), ("B", mb)) if m.n == 1],
            )
        )
    notes += [
        f"{m.title or m.name}: only in B" for m in base_b.metrics if not base_a.metric(m.name)
    ]
    for row in rows:
        if row.no_interval:
            sides = " and ".join(row.no_interval)
            notes.append(f"{row.title}: no interval on {sides} (n = 1); the ratio's is partial")
    lines = [row.line(label_a, label_b) for row in rows]
    return Comparison(
        label_a=label_a,
        label_b=label_b,
        metrics=rows,
        summary=_summary(rows, label_a, label_b),
        lines=lines,
        notes=notes,
        min_effect=min_effect,
    )


def _summary(rows: list[MetricComparison], label_a: str, label_b: str) -> str:
    """The line of the clearest difference: the decided metric whose factor is largest."""
    decided = [r for r in rows if r.verdict in ("A better", "B better")]
    if not rows:
        return f"{label_a} and {label_b} share no metric"
    if not decided:
        return f"{label_a} and {label_b}: no difference beyond the intervals on {len(rows)} metrics"
    best = max(decided, key=lambda r: r.factor()[1])
    return best.line(label_a, label_b)


def reference_names() -> list[str]:
    """Reference baselines shipped in baselines/data."""
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


def read_baseline(name_or_path: str | Path) -> dict[str, Any]:
    """A baseline document from a file path, or a shipped reference by name
    ("h200-kvm-passthrough"); validated, and a ValueError says what is wrong."""
    path = Path(name_or_path)
    if not path.exists() and (DATA_DIR / f"{name_or_path}.json").exists():
        path = DATA_DIR / f"{name_or_path}.json"
    if not path.exists():
        raise ValueError(
            f"baseline {str(name_or_path)!r}: no such file, and no shipped reference by that name "
            f"({', '.join(reference_names())})"
        )
    doc = read_json(path, "baseline file")
    BaselineResult.from_dict(doc, where=path.name)
    return doc


def _cell(m: Metric) -> str:
    interval = "" if m.n == 1 else f" [{m.ci_low:.4g}, {m.ci_high:.4g}]"
    return f"{m.value:.4g}{interval}"


def render_comparison(cmp: Comparison) -> Table:
    """A rich table: each metric's A and B values with intervals, the ratio, the verdict."""
    table = Table(
        title=f"A: {cmp.label_a}  vs  B: {cmp.label_b}",
        caption="\n".join([cmp.summary, *cmp.notes]),
    )
    table.add_column("metric")
    table.add_column("unit")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("better side, factor [95 % interval]", justify="right")
    table.add_column("verdict")
    for row in cmp.metrics:
        table.add_row(
            row.title,
            row.unit,
            _cell(row.a),
            _cell(row.b),
            row.line("A", "B").removesuffix(f" on {row.title}"),
            row.verdict,
        )
    return table

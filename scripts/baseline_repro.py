"""Reproducibility of the baseline suite (issue 4): `autotune baseline --json` twice, in two
separate processes, and per metric whether the two runs agree within their intervals. Each run
is itself pooled from 5 suite processes (1 with `--quick`): see `baselines/suite_processes.py`.

A metric agrees when its two 95 % intervals overlap. Also shown: whether each run's value lies
inside the other's interval (a stricter reading), the ratio of the two runs with the interval
`baselines.compare` propagates from them, and the relative difference. Prints a table and
writes everything as JSON; exit status 0 when every metric agrees and both runs measured the
same metrics, 1 otherwise, 2 when a run failed.

    python scripts/baseline_repro.py OUT.json [--device cuda] [--quick]
    python scripts/baseline_repro.py OUT.json --files A.json B.json   # compare two runs made before
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from baselines.compare import ratio_from_intervals
from baselines.suite import BaselineResult, Metric


@dataclass(frozen=True)
class MetricAgreement:
    name: str
    unit: str
    first: list[float]  # value, ci_low, ci_high
    second: list[float]
    overlap: bool
    each_inside_other: bool
    ratio: list[float]  # second over first: value, low, high
    rel_diff: float

    @property
    def agrees(self) -> bool:
        return self.overlap


def _triple(m: Metric) -> list[float]:
    return [m.value, m.ci_low, m.ci_high]


def agreement(first: Metric, second: Metric) -> MetricAgreement:
    """How two measurements of one metric relate."""
    overlap = max(first.ci_low, second.ci_low) <= min(first.ci_high, second.ci_high)
    inside = (
        first.ci_low <= second.value <= first.ci_high
        and second.ci_low <= first.value <= second.ci_high
    )
    # ratio_from_intervals is direction aware; on the raw scale "second over first" is wanted.
    flip = replace_direction(first), replace_direction(second)
    ratio = list(ratio_from_intervals(flip[1], flip[0]))
    return MetricAgreement(
        name=first.name,
        unit=first.unit,
        first=_triple(first),
        second=_triple(second),
        overlap=overlap,
        each_inside_other=inside,
        ratio=ratio,
        rel_diff=second.value / first.value - 1,
    )


def replace_direction(m: Metric) -> Metric:
    """The metric read as higher-is-better, so the ratio is of raw values."""
    return Metric(m.name, m.unit, m.value, m.ci_low, m.ci_high, m.n, True, m.title)


def compare_runs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Agreement of two suite documents, metric by metric."""
    a = BaselineResult.from_dict(first, where="first")
    b = BaselineResult.from_dict(second, where="second")
    rows = [agreement(m, b.metric(m.name)) for m in a.metrics if b.metric(m.name) is not None]
    only_first = [m.name for m in a.metrics if b.metric(m.name) is None]
    only_second = [m.name for m in b.metrics if a.metric(m.name) is None]
    return {
        "agree": all(r.agrees for r in rows) and not only_first and not only_second,
        "metrics": [{**asdict(r), "agrees": r.agrees} for r in rows],
        "disagreeing": [r.name for r in rows if not r.agrees],
        "only_in_first": only_first,
        "only_in_second": only_second,
        "environments": [a.environment.label, b.environment.label],
        "devices": [a.device_name, b.device_name],
    }


def autotune_command() -> list[str]:
    script = Path(sys.executable).parent / "autotune"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from appliance.cli import main; sys.exit(main())"]


def run_once(out: Path, device: str, quick: bool) -> tuple[dict[str, Any], float]:
    """One `autotune baseline --json --out` in its own process; the document and its seconds."""
    cmd = [*autotune_command(), "baseline", "--json", "--out", str(out), "--device", device]
    if quick:
        cmd.append("--quick")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}"
        )
    return json.loads(out.read_text()), seconds


def render(report: dict[str, Any]) -> str:
    lines = [f"{'metric':28} {'first [interval]':34} {'second [interval]':34} second/first  agree"]
    for m in report["metrics"]:
        v1, l1, h1 = m["first"]
        v2, l2, h2 = m["second"]
        r, rl, rh = m["ratio"]
        lines.append(
            f"{m['name']:28} {f'{v1:.5g} [{l1:.5g}, {h1:.5g}]':34} "
            f"{f'{v2:.5g} [{l2:.5g}, {h2:.5g}]':34} "
            f"{r:.4f} [{rl:.4f}, {rh:.4f}]  {'yes' if m['agrees'] else 'NO'}"
        )
    for key in ("only_in_first", "only_in_second"):
        if report[key]:
            lines.append(f"{key.replace('_', ' ')}: {', '.join(report[key])}")
    verdict = "all metrics agree" if report["agree"] else "NOT reproduced"
    lines.append(
        f"{verdict}: {len(report['metrics']) - len(report['disagreeing'])}/"
        f"{len(report['metrics'])} metrics within their intervals"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="JSON report to write")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--files", nargs=2, type=Path, metavar=("A", "B"), help="compare these")
    args = ap.parse_args(argv)
    runs: list[dict[str, Any]] = []
    docs: list[dict[str, Any]] = []
    if args.files:
        for path in args.files:
            try:
                docs.append(json.loads(path.read_text()))
            except (OSError, ValueError) as err:
                print(f"--files: cannot read {path}: {err}", file=sys.stderr)
                return 2
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for i in (1, 2):
            path = args.out.with_name(f"{args.out.stem}.run{i}.json")
            try:
                doc, seconds = run_once(path, args.device, args.quick)
            except RuntimeError as err:
                print(f"run {i}: {err}", file=sys.stderr)
                return 2
            docs.append(doc)
            runs.append({"file": str(path), "seconds": round(seconds, 2)})
    try:
        report = compare_runs(*docs)
    except ValueError as err:
        print(f"not a baseline document: {err}", file=sys.stderr)
        return 2
    report["runs"] = runs or [{"file": str(p)} for p in args.files]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(render(report))
    return 0 if report["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())

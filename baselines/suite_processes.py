"""The baseline suite in several fresh processes, one after another, with each metric's blocks
pooled.

What one process holds fixed for its whole life shifts its figures against the next process's:
where its host buffers landed, the GPU's power and thermal state while it ran. One process's
interval cannot show that (on the H200 two single-process runs differed by 2.2 % on fp8 GEMM and
3.9 % on host memory bandwidth, each outside the other's interval). So, as pyperf spreads a
benchmark over worker processes, `pooled_suite` runs `run_suite` in `processes` fresh
interpreters (`python -m baselines.suite_processes`), never two at once so they do not share the
GPU, and gives each metric the median of all its blocks with a two-level bootstrap interval
(processes, then blocks within each): `baselines.stats.summarize_groups`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from baselines.stats import summarize_groups
from baselines.suite import BaselineResult, Metric, parse_device, run_suite

PROCESS_TIMEOUT_S = 900  # one process's whole suite; far above the minute a full GPU run takes
DEFAULT_PROCESSES = 5  # two runs of 5 overlap unless one's 5 all fall beyond the other's


class SuiteProcessError(RuntimeError):
    """A suite process failed or ran past its time; the message names it and ends with its log."""


def pooled_suite(
    device: str,
    quick: bool,
    processes: int,
    progress: Callable[[str], None] | None = None,
) -> BaselineResult:
    """`run_suite(device, quick)` in `processes` fresh processes, one after another, pooled;
    with one process, `run_suite` in this one."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive integer, got {processes!r}")
    if processes == 1:
        return run_suite(device, quick=quick, progress=progress)
    parse_device(device)  # a device that is not there fails here, not in five processes
    say = progress or (lambda _message: None)
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="autotune-baseline-") as tmp:
        for i in range(processes):
            say(f"baseline: process {i + 1} of {processes}")
            results.append(_run_process(device, quick, Path(tmp) / f"process-{i}.json", i))
    return pool_results(results, duration_s=round(time.perf_counter() - started, 3))


def _run_process(device: str, quick: bool, out: Path, index: int) -> BaselineResult:
    command = [sys.executable, "-m", "baselines.suite_processes", device, str(out)]
    command += ["--quick"] if quick else []
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise SuiteProcessError(
            f"baseline process {index + 1} ran past {PROCESS_TIMEOUT_S} s and was stopped"
        ) from exc
    if done.returncode != 0 or not out.exists():
        tail = "\n".join((done.stderr or "").strip().splitlines()[-15:])
        raise SuiteProcessError(
            f"baseline process {index + 1} failed (exit code {done.returncode}):\n{tail}"
        )
    return BaselineResult.from_dict(json.loads(out.read_text()), f"baseline process {index + 1}")


def pool_results(results: list[BaselineResult], duration_s: float = 0.0) -> BaselineResult:
    """One result from several processes' results: per metric, every block, the median over all
    of them and the two-level interval; the first process's environment and versions."""
    if not results:
        raise ValueError("no results to pool")
    names = list(dict.fromkeys(m.name for r in results for m in r.metrics))
    notes = list(dict.fromkeys(note for r in results for note in r.notes))
    metrics = []
    for name in names:
        got: list[Metric] = [m for r in results if (m := r.metric(name)) is not None]
        missing = [m.name for m in got if not m.blocks]
        if missing:
            raise ValueError(f"metric {name!r} has no blocks to pool (written by an older suite)")
        summary = summarize_groups([list(m.blocks) for m in got])
        metrics.append(
            replace(
                got[0],
                value=summary.median,
                ci_low=summary.ci_low,
                ci_high=summary.ci_high,
                n=summary.n,
                blocks=tuple(b for m in got for b in m.blocks),
                processes=len(got),
            )
        )
        if len(got) < len(results):
            notes.append(f"{name}: measured in {len(got)} of {len(results)} processes")
    telemetry = {
        "available": any(r.telemetry.get("available") for r in results),
        "processes": [r.telemetry for r in results],
    }
    return replace(
        results[0], metrics=metrics, telemetry=telemetry, notes=notes, duration_s=duration_s
    )


def _main(argv: list[str]) -> int:
    """One suite process: `python -m baselines.suite_processes DEVICE OUT.json [--quick]`."""
    quick = "--quick" in argv
    device, out = [a for a in argv if a != "--quick"]
    result = run_suite(device, quick=quick, progress=lambda m: print(m, file=sys.stderr))
    Path(out).write_text(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

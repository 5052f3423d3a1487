"""Hardware, kernel and end-to-end gains from ONE measurement that interleaves host states.

    rounds = interleave_host_states(measure, tuned, n_rounds, say)   # stock, tuned, stock, ...
    block = gains_block(rounds, workload, tuned_host="profile stable", notes=[...])

Each round measures the host stock, then with the profile applied (`tuned()` applies it and
restores it when the block ends): ABAB... of host states, so slow drift (temperature, other
tenants) falls on both sides alike. In each host state the same kernels are timed: for every
shape of the workload the dispatch winner (the task's final kernel) and the best peer, timed
interleaved by the evaluator. From those blocks, with no ratio multiplied by another:

- hardware: dispatch kernels, stock host / tuned host;
- kernel: best peers / dispatch kernels, both on the stock host;
- end to end (combined): best peers on the stock host / dispatch kernels on the tuned host.

A ratio is time(baseline) / time(tuned), above 1 faster. Blocks are paired by round and position
(round r's k-th block of one side with round r's k-th block of the other), and a ratio over many
shapes is the weighted geometric mean of the per-shape ratios with a bootstrap interval that
resamples every shape's pairs (`baselines.stats.geomean_ratio_interval`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from baselines.stats import geomean_ratio_interval

STOCK, TUNED = "stock", "tuned"
DISPATCH, PEER = "dispatch", "peer"
Side = tuple[str, str]  # (host state, kernels)


class GainsError(Exception):
    """The gains could not be measured (a kernel rejected, nothing timed); says why."""


@dataclass
class StateSample:
    """One host state's measurement: blocks (seconds) per workload point and kernel role."""

    kernels: dict[str, dict[str, list[float]]]  # "task/shape" -> {"dispatch": [...], "peer": [...]}
    method: str = "host-clock"
    suite: dict | None = None  # a `baselines.suite` result (to_dict), when measured


@dataclass(frozen=True)
class Workload:
    """The points timed and their weights (summing to 1), and a sentence saying what it is."""

    weights: dict[str, float]
    description: str


@dataclass
class Rounds:
    samples: list[dict[str, StateSample]] = field(default_factory=list)  # {STOCK: .., TUNED: ..}

    def __len__(self) -> int:
        return len(self.samples)


def interleave_host_states(
    measure: Callable[[str, int], StateSample],
    tuned: Callable[[], AbstractContextManager],
    rounds: int,
    say: Callable[[str], None] = lambda _m: None,
) -> Rounds:
    """`rounds` rounds of measure(STOCK, r), then measure(TUNED, r) inside `tuned()`.

    Whatever `measure` raises (or a signal) leaves `tuned()`'s block, which restores the host
    before the error reaches the caller."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    out = Rounds()
    for r in range(1, rounds + 1):
        say(f"round {r}/{rounds}: stock host")
        stock = measure(STOCK, r)
        say(f"round {r}/{rounds}: applying the profile")
        with tuned():
            say(f"round {r}/{rounds}: tuned host")
            tuned_sample = measure(TUNED, r)
        say(f"round {r}/{rounds}: restored the stock host")
        out.samples.append({STOCK: stock, TUNED: tuned_sample})
    return out


def paired_blocks(rounds: Rounds, a: Side, b: Side) -> dict[str, tuple[list[float], list[float]]]:
    """Per workload point, side A's and side B's blocks paired by round and position; points
    missing a side in some round are left out."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    keys = set.intersection(*(set(s[a[0]].kernels) & set(s[b[0]].kernels) for s in rounds.samples))
    for key in sorted(keys):
        xs: list[float] = []
        ys: list[float] = []
        for sample in rounds.samples:
            x = sample[a[0]].kernels[key].get(a[1]) or []
            y = sample[b[0]].kernels[key].get(b[1]) or []
            k = min(len(x), len(y))
            xs += x[:k]
            ys += y[:k]
        if xs:
            out[key] = (xs, ys)
    return out


def gain_ratio(rounds: Rounds, baseline: Side, tuned: Side, workload: Workload) -> dict | None:
    """time(baseline) / time(tuned) over the workload, with its interval; None when no point
    has both sides."""
    pairs = paired_blocks(rounds, baseline, tuned)
    keys = [k for k in pairs if workload.weights.get(k, 0) > 0]
    if not keys:
        return None
    interval = geomean_ratio_interval([pairs[k] for k in keys], [workload.weights[k] for k in keys])
    return {
        "ratio": interval.ratio,
        "ci_low": min(interval.ci_low, interval.ratio),
        "ci_high": max(interval.ci_high, interval.ratio),
        "n_blocks": max(1, interval.n),
    }


def suite_metrics(rounds: Rounds) -> tuple[list[dict], list[str]]:
    """Per-metric ratios of the baseline suite, tuned host (A) against stock host (B), from the
    first round where both states ran it; the notes say what was left out."""
    from baselines.compare import compare_baselines

    for sample in rounds.samples:
        stock, tuned = sample[STOCK].suite, sample[TUNED].suite
        if stock is not None and tuned is not None:
            cmp = compare_baselines(tuned, stock, labels=("tuned host", "stock host"))
            return [m.to_dict() for m in cmp.metrics], list(cmp.notes)
    return [], ["the baseline suite was not measured in both host states"]


def _method(rounds: Rounds) -> str:
    methods = {s[state].method for s in rounds.samples for state in (STOCK, TUNED)}
    return "cuda-graph" if methods == {"cuda-graph"} else "host-clock"


def gains_block(
    rounds: Rounds, workload: Workload, *, tuned_host: str, notes: list[str] | None = None
) -> dict[str, Any]:
    """The report's `gains` block (hardware, kernel, end_to_end), every ratio from `rounds`."""
    notes = list(notes or [])
    hardware = gain_ratio(rounds, (STOCK, DISPATCH), (TUNED, DISPATCH), workload)
    kernel = gain_ratio(rounds, (STOCK, PEER), (STOCK, DISPATCH), workload)
    combined = gain_ratio(rounds, (STOCK, PEER), (TUNED, DISPATCH), workload)
    common = {"workload": workload.description, "rounds": len(rounds)}
    metrics, suite_notes = suite_metrics(rounds)
    out: dict[str, Any] = {"hardware": None, "kernel": None, "end_to_end": None}
    if hardware is not None:
        out["hardware"] = {
            **hardware,
            **common,
            "baseline": "dispatch table on the stock host",
            "tuned": f"dispatch table on the host under {tuned_host}",
            "metrics": metrics,
            "notes": notes + suite_notes,
        }
    if kernel is not None:
        out["kernel"] = {
            **kernel,
            **common,
            "baseline": "best peers on the stock host",
            "tuned": "dispatch table on the stock host",
        }
    if combined is not None:
        out["end_to_end"] = {
            "workload": workload.description,
            "tuned": {"kernels": "dispatch table", "host": tuned_host},
            "baseline": {"kernels": "best peers", "host": "stock"},
            "combined": combined,
            "kernel_only": kernel,
            "hardware_only": hardware,
            "method": _method(rounds),
            "rounds": len(rounds),
            "notes": notes,
        }
    return out

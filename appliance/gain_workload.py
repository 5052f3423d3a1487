"""The workload of the gains: every task's shapes, with the kernel that wins each (the dispatch
table) and the best peer, timed through the evaluator in one host state.

Workload: all shapes of every task, combined as a weighted geometric mean of per-shape time
ratios with the loop's shape weights (normalised within a task; tasks weigh equally).
Candidate code runs only in the evaluator's worker process, as in the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.gains import DISPATCH, PEER, GainsError, StateSample, Workload

CANDIDATE = "candidate"
if TYPE_CHECKING:
    from loop.tasks import Task

QUICK_RULE = {"samples_per_block": 5, "min_blocks": 3, "max_blocks": 6, "max_time_s": 0.25}


@dataclass(frozen=True)
class KernelPlan:
    """What to time for one task: its incumbent, and per shape the winner and the best peer."""

    task: Task
    candidate: Path
    params: dict
    winners: dict[str, str]  # shape -> CANDIDATE or a peer name (the dispatch table)
    best_peers: dict[str, str | None]  # shape -> the best peer, None when no peer was timed
    weights: dict[str, float]  # shape -> the loop's weight

    @property
    def peers(self) -> list[str]:
        named = {p for p in self.best_peers.values() if p}
        named |= {w for w in self.winners.values() if w != CANDIDATE}
        return sorted(named)


def plan_from_section(task: Task, section: dict, candidate: Path, params: dict) -> KernelPlan:
    """A KernelPlan from a task's report section (its dispatch table and shapes)."""
    winners = {}
    for entry in section["dispatch"]:
        for shape in entry["shapes"]:
            winners[shape] = entry["candidate"] if entry["source"] == "peer" else CANDIDATE
    shapes = [s for s in section["shapes"] if s["name"] in winners]
    return KernelPlan(
        task=task,
        candidate=Path(candidate),
        params=dict(params),
        winners=winners,
        best_peers={s["name"]: s.get("best_peer") for s in shapes},
        weights={s["name"]: float(s["weight"]) for s in shapes},
    )


def key(task_name: str, shape: str) -> str:
    return f"{task_name}/{shape}"


def workload_of(plans: list[KernelPlan]) -> Workload:
    """Weights of every task's shapes (each task sums to 1 / number of tasks) and a sentence."""
    weights: dict[str, float] = {}
    parts = []
    for plan in plans:
        total = sum(plan.weights.values()) or 1.0
        for shape, weight in plan.weights.items():
            weights[key(plan.task.name, shape)] = weight / total / len(plans)
        parts.append(f"{plan.task.name} ({len(plan.weights)} shapes)")
    description = (
        f"every shape of {', '.join(parts)}, timed shape by shape; the weighted geometric mean "
        "of the per-shape time ratios with the loop's shape weights"
        + ("; tasks weigh equally" if len(plans) > 1 else "")
    )
    return Workload(weights, description)


def measure_kernels(
    plans: list[KernelPlan], device: str, rule: dict, say: Callable[[str], None]
) -> StateSample:
    """Time every plan's winners and best peers on every shape, interleaved by the evaluator."""
    from loop.evaluator import CandidateSpec, evaluate

    kernels: dict[str, dict[str, list[float]]] = {}
    methods = set()
    for plan in plans:
        say(
            f"  timing {plan.task.name}: dispatch winners and best peers ({len(plan.winners)} shapes)"
        )
        ev = evaluate(
            plan.task,
            [CandidateSpec(plan.candidate, plan.params, CANDIDATE)],
            device,
            time_it=True,
            peers=plan.peers,
            shapes=list(plan.winners),
            rule=rule,
        )
        verdicts = {v.label: v for v in ev.verdicts if v.accepted}
        if CANDIDATE not in verdicts:
            mine = ev.by_label(CANDIDATE)
            why = "; ".join(f"{r.code}: {r.message}" for r in mine.reasons)
            raise GainsError(
                f"{plan.task.name}: the incumbent was rejected while timing the gains: {why}"
            )
        for shape, winner in plan.winners.items():
            point = {}
            for role, label in ((DISPATCH, winner), (PEER, plan.best_peers.get(shape))):
                result = verdicts[label].shapes.get(shape) if label in verdicts else None
                if result is not None and result.blocks_s and not result.dropped:
                    point[role] = list(result.blocks_s)
                    methods.add(result.method or "host-clock")
            if DISPATCH in point:
                kernels[key(plan.task.name, shape)] = point
    if not kernels:
        raise GainsError("no kernel could be timed for the gains")
    method = "cuda-graph" if methods == {"cuda-graph"} else "host-clock"
    return StateSample(kernels, method)

"""When the loop stops: a goal (speedup over the best peer, or a fraction of the roofline), a
budget (trials, time, agent calls), a plateau (so many experiments without a keep), or the
proposer running out. The reason is a stable code and a sentence."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class StopRule:
    trials: int | None = None
    seconds: float | None = None
    agent_calls: int | None = None
    plateau: int | None = None
    goal_speedup: float | None = None  # weighted geomean over shapes, against the best peer
    goal_roofline: float | None = None  # weighted geomean of floor time / incumbent time


@dataclass
class Progress:
    finished: int
    seconds: float
    agent_calls: int
    since_keep: int
    speedup_vs_peer: float | None = None
    roofline_fraction: float | None = None


@dataclass
class Stop:
    code: str  # goal-speedup, goal-roofline, trials, time, agent-calls, plateau, exhausted
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def check(rule: StopRule, p: Progress) -> Stop | None:
    if rule.goal_speedup and p.speedup_vs_peer and p.speedup_vs_peer >= rule.goal_speedup:
        return Stop(
            "goal-speedup",
            f"goal reached: {p.speedup_vs_peer:.3f}x over the best peer "
            f"(goal {rule.goal_speedup:g}x)",
        )
    if rule.goal_roofline and p.roofline_fraction and p.roofline_fraction >= rule.goal_roofline:
        return Stop(
            "goal-roofline",
            f"goal reached: {p.roofline_fraction * 100:.1f} % of the roofline "
            f"(goal {rule.goal_roofline * 100:g} %)",
        )
    if rule.trials is not None and p.finished >= rule.trials:
        return Stop("trials", f"trial budget reached ({p.finished} of {rule.trials})")
    if rule.seconds is not None and p.seconds >= rule.seconds:
        return Stop("time", f"time budget reached ({p.seconds:.0f} s of {rule.seconds:g} s)")
    if rule.agent_calls is not None and p.agent_calls >= rule.agent_calls:
        return Stop("agent-calls", f"agent-call budget reached ({p.agent_calls})")
    if rule.plateau and p.since_keep >= rule.plateau:
        return Stop("plateau", f"plateau: {p.since_keep} experiments in a row without a keep")
    return None


def weighted_geomean(values: list[float], weights: list[float]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v and v > 0]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    return math.exp(sum(w * math.log(v) for v, w in pairs) / total)

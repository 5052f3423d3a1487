"""Stopping rules: goals, budgets and plateaus, each with its code and sentence."""

from __future__ import annotations

import pytest

from loop.stopping import Progress, StopRule, check, weighted_geomean


def p(**kw) -> Progress:
    base = {"finished": 3, "seconds": 10.0, "agent_calls": 0, "since_keep": 1}
    return Progress(**(base | kw))


@pytest.mark.parametrize(
    ("rule", "progress", "code"),
    [
        (StopRule(goal_speedup=1.5), p(speedup_vs_peer=1.6), "goal-speedup"),
        (StopRule(goal_speedup=1.5), p(speedup_vs_peer=1.4), None),
        (StopRule(goal_roofline=0.8), p(roofline_fraction=0.85), "goal-roofline"),
        (StopRule(trials=3), p(), "trials"),
        (StopRule(trials=4), p(), None),
        (StopRule(seconds=5), p(), "time"),
        (StopRule(agent_calls=2), p(agent_calls=2), "agent-calls"),
        (StopRule(plateau=3), p(since_keep=3), "plateau"),
        (StopRule(plateau=3), p(since_keep=2), None),
        (StopRule(), p(), None),
    ],
)
def test_rules(rule: StopRule, progress: Progress, code: str | None) -> None:
    stop = check(rule, progress)
    assert (stop and stop.code) == code
    if stop:
        assert stop.message and stop.to_dict()["code"] == code


def test_goal_comes_before_budgets() -> None:
    stop = check(StopRule(trials=1, goal_speedup=1.1), p(speedup_vs_peer=2.0))
    assert stop.code == "goal-speedup" and "2.000x" in stop.message


def test_weighted_geomean() -> None:
    assert weighted_geomean([2.0, 8.0], [1.0, 1.0]) == pytest.approx(4.0)
    assert weighted_geomean([2.0, 8.0], [3.0, 0.0]) == pytest.approx(2.0)
    assert weighted_geomean([0.0], [1.0]) is None

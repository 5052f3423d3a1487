"""Checks shared by the task tests: run candidates (shipped ones and a deliberately wrong one
written to a temporary folder) through the evaluator in one worker, and read the verdicts."""

from __future__ import annotations

from pathlib import Path

from loop.evaluator import CandidateSpec, Evaluation, evaluate
from loop.tasks import Task


def evaluate_with_wrong(
    task: Task, shipped: list[tuple[str, dict]], wrong_source: str, folder: Path
) -> Evaluation:
    """One CPU evaluation of the shipped candidates (file name, params) and of `wrong_source`,
    labelled by file name and "wrong"."""
    wrong = folder / "wrong.py"
    wrong.write_text(wrong_source)
    specs = [
        CandidateSpec(task.folder / name, params, f"{name}:{i}")
        for i, (name, params) in enumerate(shipped)
    ]
    return evaluate(task, [*specs, CandidateSpec(wrong, {}, "wrong")], "cpu")


def assert_shipped_accepted(ev: Evaluation, tolerance: float = 1e-5) -> None:
    for verdict in ev.verdicts:
        if verdict.label == "wrong":
            continue
        assert verdict.accepted, (verdict.label, verdict.reasons)
        assert verdict.shapes, verdict.label
        assert max(s.rel_err for s in verdict.shapes.values()) < tolerance, verdict.label


def assert_wrong_rejected(ev: Evaluation, code: str = "mismatch") -> None:
    verdict = ev.by_label("wrong")
    assert not verdict.accepted
    assert code in {r.code for r in verdict.reasons}, verdict.reasons


def gpu_evaluate(task: Task, shipped: list[tuple[str, dict]]) -> Evaluation:
    specs = [CandidateSpec(task.folder / name, params, name) for name, params in shipped]
    return evaluate(task, specs, "cuda")

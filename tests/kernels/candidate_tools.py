"""Helpers for the kernel task tests: a mutated copy of a shipped candidate, and one evaluation of
several candidates on the CPU in a single worker (the Triton interpreter is slow to start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from loop.evaluator import TRUST_INTERPRETER_ENV, CandidateSpec, Evaluation, evaluate
from loop.tasks import Task


def mutated(source: Path, old: str, new: str, dest: Path) -> Path:
    """A copy of `source` with `old` (which must occur) replaced by `new`: a plausible bug."""
    text = source.read_text()
    assert old in text, f"{old!r} not in {source.name}"
    dest.write_text(text.replace(old, new))
    return dest


def evaluate_on_cpu(task: Task, specs: dict[str, tuple[Path, dict]]) -> Evaluation:
    """Verify every candidate of `specs` (label -> (path, params)) in one worker. The mutants
    are the tests' own code, so the Triton interpreter may run them on the CPU."""
    candidates = [CandidateSpec(path, params, label) for label, (path, params) in specs.items()]
    before = os.environ.get(TRUST_INTERPRETER_ENV)
    os.environ[TRUST_INTERPRETER_ENV] = "1"
    try:
        return evaluate(task, candidates, "cpu")
    finally:
        if before is None:
            del os.environ[TRUST_INTERPRETER_ENV]
        else:
            os.environ[TRUST_INTERPRETER_ENV] = before


def cli_verify(task: str, candidate: str, params: dict) -> tuple[int, dict]:
    """`autotune verify TASK CANDIDATE --params ... --device cpu --json`, as a user runs it."""
    args = ["verify", task, candidate, "--params", json.dumps(params), "--device", "cpu", "--json"]
    result = subprocess.run(
        [sys.executable, "-m", "appliance", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.returncode, json.loads(result.stdout)

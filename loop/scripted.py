"""The scripted proposer: replays a folder of steps in name order, one proposal per step. A step
is a whole candidate file (`*.py`, written over the candidate) or a patch (`*.patch`, `*.diff`,
applied with `git apply` in the workspace; a patch may touch any file, and the workspace lock
then rejects it). Used by the tests and to reproduce a past run (`git format-patch` of the
loop's branch gives the patches)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import optuna

from loop.proposers import Outcome, Proposal, drop_trial, open_trial
from loop.store import Ledger
from loop.workspace import Workspace

STEP_SUFFIXES = (".py", ".patch", ".diff")


class ScriptError(Exception):
    """The script folder is missing or holds no steps."""


def read_steps(folder: Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise ScriptError(f"--script {folder}: not a folder")
    steps = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in STEP_SUFFIXES)
    if not steps:
        raise ScriptError(f"--script {folder}: no *.py, *.patch or *.diff steps")
    return steps


def describe(step: Path) -> str:
    """The first line of the step's docstring (a file) or of its message (a patch)."""
    text = step.read_text(errors="replace")
    if step.suffix == ".py":
        try:
            doc = ast.get_docstring(ast.parse(text))
        except SyntaxError:
            doc = None
    else:
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("diff ")]
        doc = lines[0].removeprefix("Subject: ").removeprefix("[PATCH] ") if lines else None
        if doc and doc.startswith(("---", "From ")):
            doc = None
    return f"{step.name}: {doc.splitlines()[0]}" if doc else step.name


def apply_step(step: Path, ws: Workspace) -> str | None:
    """Apply one step to the workspace; an error message when it cannot be applied."""
    if step.suffix == ".py":
        ws.candidate.write_bytes(step.read_bytes())
        return None
    tries = ([], ["--directory", ws.task_name])
    last = ""
    for extra in tries:
        done = subprocess.run(
            [
                "git",
                "-C",
                str(ws.root),
                "apply",
                "--whitespace=nowarn",
                *extra,
                str(step.resolve()),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            return None
        last = done.stderr.strip()[-300:]
    return f"{step.name} does not apply: {last}"


class ScriptedProposer:
    kind = "scripted"

    def __init__(
        self,
        study: optuna.Study,
        ledger: Ledger,
        owner: str,
        ws: Workspace,
        steps: list[Path],
    ) -> None:
        self.study, self.ledger, self.owner, self.ws, self.steps = study, ledger, owner, ws, steps

    def propose(self) -> Proposal | None:
        claimed = self.ledger.claimed()
        for i, step in enumerate(self.steps):
            key = f"step:{i:04d}:{step.name}"
            if key in claimed:
                continue
            trial = open_trial(self.study, self.owner, self.kind)
            if not self.ledger.claim(key, trial.number, self.owner):
                drop_trial(self.study, trial, "duplicate")
                claimed = self.ledger.claimed()
                continue
            error = apply_step(step, self.ws)
            return Proposal(
                self.ws.candidate,
                {},
                describe(step),
                trial.number,
                kind=self.kind,
                key=key,
                trial=trial,
                error=error,
            )
        return None

    def feedback(self, proposal: Proposal, outcome: Outcome) -> None:
        return None

"""The agent proposer: an external command (any coding-agent CLI) run in the workspace with a
time limit. The command line is configuration with `{brief}` (the brief's path) and
`{workspace}` (the task folder in the workspace) placeholders; it is split with shlex and the
placeholders are replaced inside the arguments, never pasted into a shell string. The agent's
edit of the candidate file is the proposal."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import optuna

from loop.proposers import Outcome, Proposal, open_trial, source_key
from loop.store import Ledger
from loop.workspace import Workspace

DEFAULT_TIMEOUT_S = 1800.0


class AgentError(Exception):
    """The agent command line is not usable."""


def agent_argv(command: str, brief: Path, workspace: Path) -> list[str]:
    try:
        tokens = shlex.split(command)
    except ValueError as exc:
        raise AgentError(f"--agent-command cannot be split: {exc}") from exc
    if not tokens:
        raise AgentError("--agent-command is empty")
    return [t.replace("{brief}", str(brief)).replace("{workspace}", str(workspace)) for t in tokens]


def run_agent(argv: list[str], cwd: Path, timeout_s: float, log: Path, env: dict) -> dict:
    """Run the agent in its own process group; on timeout the whole group is killed."""
    started = time.monotonic()
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=str(cwd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return {"returncode": None, "timed_out": False, "error": str(exc), "seconds": 0.0}
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "seconds": time.monotonic() - started,
    }


class AgentProposer:
    kind = "agent"

    def __init__(
        self,
        study: optuna.Study,
        ledger: Ledger,
        owner: str,
        ws: Workspace,
        command: str,
        brief: Callable[[], str],
        log_dir: Path,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        agent_argv(command, Path("brief.md"), ws.task_dir)  # fail early on a bad command line
        self.study, self.ledger, self.owner, self.ws = study, ledger, owner, ws
        self.command, self.brief, self.log_dir, self.timeout_s = command, brief, log_dir, timeout_s

    def propose(self) -> Proposal | None:
        trial = open_trial(self.study, self.owner, self.kind)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        brief = self.log_dir / f"brief-{trial.number}.md"
        brief.write_text(self.brief())
        before = self.ws.candidate.read_text()
        argv = agent_argv(self.command, brief, self.ws.task_dir)
        env = dict(os.environ, AUTOTUNE_BRIEF=str(brief), AUTOTUNE_WORKSPACE=str(self.ws.task_dir))
        env = {k: v for k, v in env.items() if not k.startswith("AUTOTUNE_SECRET")}
        run = run_agent(
            argv, self.ws.task_dir, self.timeout_s, self.log_dir / f"agent-{trial.number}.log", env
        )
        trial.set_user_attr("agent", run)
        try:
            source = self.ws.candidate.read_text()
        except (OSError, UnicodeDecodeError):
            source = ""
        extra = {"agent": run, "unchanged": source == before}
        error = None
        if run.get("error"):
            error = f"the agent command failed to start: {run['error']}"
        key = source_key(source, {})
        fresh = error is None and not extra["unchanged"]
        if fresh and not self.ledger.claim(key, trial.number, self.owner):
            extra["duplicate"] = True
        what = "timed out" if run["timed_out"] else f"exit {run['returncode']}"
        return Proposal(
            self.ws.candidate,
            {},
            f"agent call {trial.number} ({what}, {run['seconds']:.0f} s)",
            trial.number,
            extra=extra,
            kind=self.kind,
            key=key,
            trial=trial,
            error=error,
        )

    def feedback(self, proposal: Proposal, outcome: Outcome) -> None:
        return None

"""The loop's workspace: a private git repository holding only a copy of the task folder, on the
loop's branch. Proposals edit the candidate file there; a keep is a commit carrying the measured
result, a revert resets to the last commit and removes anything new.

The lock: every file of the workspace, of the installed task folder and of the harness packages,
except the candidate, is hashed before a proposal and checked after it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BRANCH = "autotune-loop"
STATE_FILE = "INCUMBENT.json"
_GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false"]
_HARNESS = ("loop", "baselines", "host_tuning")


class WorkspaceError(Exception):
    """git failed in the workspace."""


@dataclass
class Workspace:
    root: Path
    task_name: str
    candidate_name: str
    head: str = ""

    @property
    def task_dir(self) -> Path:
        return self.root / self.task_name

    @property
    def candidate(self) -> Path:
        return self.task_dir / self.candidate_name

    def git(self, *args: str) -> str:
        done = subprocess.run(
            [*_GIT, "-C", str(self.root), *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise WorkspaceError(f"git {' '.join(args)}: {done.stderr.strip()[-400:]}")
        return done.stdout.strip()

    def state(self) -> dict:
        try:
            return json.loads((self.root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def commit(self, message: str, state: dict) -> str:
        """Commit everything as it is now, with `state` (the incumbent record) beside it."""
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        self.git("add", "-A")
        self.git(
            "-c",
            "user.name=autotune",
            "-c",
            "user.email=autotune@localhost",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            message,
        )
        self.head = self.git("rev-parse", "HEAD")
        return self.head

    def revert(self) -> None:
        """Back to the last commit of the loop (whatever a proposal committed or wrote)."""
        self.git("checkout", "-q", "-f", "-B", BRANCH, self.head)
        self.git("reset", "-q", "--hard", self.head)
        self.git("clean", "-q", "-f", "-d", "-x")

    def dirty(self) -> bool:
        return bool(self.git("status", "--porcelain"))


def open_workspace(folder: Path, task_folder: Path, candidate_name: str, source: str) -> Workspace:
    """Create or reopen the workspace in `folder`: reset to the branch head, remove anything
    left by a killed run, and make the task files equal to the installed task again."""
    ws = Workspace(folder, task_folder.name, candidate_name)
    if not (folder / ".git").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        ws.git("init", "-q", "-b", BRANCH)
    try:
        ws.head = ws.git("rev-parse", "--verify", "-q", f"refs/heads/{BRANCH}")
    except WorkspaceError:
        ws.head = ""
    if ws.head:
        ws.revert()
    _copy_task(task_folder, ws.task_dir, candidate_name)
    if not ws.head:
        ws.candidate.write_text(source)
        ws.commit(f"start: {candidate_name} as given", {"version": 0, "params": {}})
    elif ws.dirty():
        ws.commit("sync the task files with the installed task", ws.state())
    return ws


def _copy_task(src: Path, dst: Path, candidate_name: str) -> None:
    wanted = {
        p.relative_to(src)
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name != candidate_name
    }
    dst.mkdir(parents=True, exist_ok=True)
    for rel in sorted(wanted):
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() != (src / rel).read_bytes():
            shutil.copyfile(src / rel, target)
    for p in sorted(dst.rglob("*"), reverse=True):
        rel = p.relative_to(dst)
        if p.is_file() and rel not in wanted and p.name != candidate_name:
            p.unlink()


def _hash_tree(root: Path, skip: set[Path], suffix: str | None = None) -> dict[str, str]:
    out = {}
    if not root.is_dir():
        return out
    for p in sorted(root.rglob("*")):
        if ".git" in p.relative_to(root).parts or "__pycache__" in p.parts:
            continue
        if not p.is_file() or p.resolve() in skip or (suffix and p.suffix != suffix):
            continue
        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def harness_root() -> Path:
    return Path(__file__).resolve().parent.parent


def lock(ws: Workspace, installed_task: Path) -> dict[str, str]:
    """Hashes of every file a proposal must not touch."""
    skip = {ws.candidate.resolve()}
    hashes = _hash_tree(ws.root, skip)
    hashes.update(_hash_tree(installed_task, skip))
    for name in _HARNESS:
        hashes.update(_hash_tree(harness_root() / name, skip, ".py"))
    return hashes


def changed_files(before: dict[str, str], ws: Workspace, installed_task: Path) -> list[str]:
    """Files added, removed or changed since `lock` (the candidate excepted)."""
    after = lock(ws, installed_task)
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))

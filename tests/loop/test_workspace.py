"""The workspace: a git repo with a copy of the task; the lock sees any change but the
candidate's; keep commits, revert resets, and reopening after a crash cleans up."""

from __future__ import annotations

import subprocess
from pathlib import Path

from loop.tasks import load_task
from loop.workspace import changed_files, lock, open_workspace


def test_lock_keep_revert_and_reopen(tmp_path: Path) -> None:
    task = load_task("rmsnorm")
    source = (task.folder / "torch_rmsnorm.py").read_text()
    ws = open_workspace(tmp_path / "ws", task.folder, "torch_rmsnorm.py", source)
    assert (ws.task_dir / "task.py").read_text() == (task.folder / "task.py").read_text()
    before = lock(ws, task.folder)
    ws.candidate.write_text(source + "\n# faster\n")
    assert changed_files(before, ws, task.folder) == []
    (ws.task_dir / "task.py").write_text("TOLERANCE = {}\n")
    (ws.task_dir / "new.py").write_text("x = 1\n")
    changed = changed_files(before, ws, task.folder)
    assert changed == sorted([str(ws.task_dir / "new.py"), str(ws.task_dir / "task.py")])

    ws.revert()
    assert ws.candidate.read_text() == source and not (ws.task_dir / "new.py").exists()
    assert changed_files(before, ws, task.folder) == []

    ws.candidate.write_text(source + "\n# kept\n")
    head = ws.commit("keep trial 1: speedup 1.2x", {"version": 1})
    assert ws.state() == {"version": 1}
    ws.candidate.write_text("garbage")
    subprocess.run(["git", "-C", str(ws.root), "checkout", "-q", "-b", "elsewhere"], check=True)
    again = open_workspace(tmp_path / "ws", task.folder, "torch_rmsnorm.py", "ignored")
    assert again.head == head and again.candidate.read_text().endswith("# kept\n")
    assert not again.dirty()

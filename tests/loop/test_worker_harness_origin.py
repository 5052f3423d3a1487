"""The worker imports the harness from the evaluator's own copy, never from the candidate's
workspace: a workspace holding fake `loop/` and `baselines/` packages, made the current
directory and put on PYTHONPATH, changes nothing."""

from __future__ import annotations

import shutil

import pytest

from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task
from loop.worker import _check_harness_origin

FAKE = """
from pathlib import Path
Path({marker!r}).write_text("the fake harness was imported")
raise ImportError("fake harness")
"""


def test_a_fake_harness_in_the_workspace_is_never_imported(tmp_path, monkeypatch) -> None:
    task = load_task("rmsnorm")
    workspace = tmp_path / "workspace"
    marker = tmp_path / "imported.txt"
    for package in ("loop", "baselines"):
        (workspace / package).mkdir(parents=True)
        (workspace / package / "__init__.py").write_text(FAKE.format(marker=str(marker)))
        (workspace / package / "worker.py").write_text(FAKE.format(marker=str(marker)))
    candidate = workspace / "candidate.py"
    shutil.copy(task.folder / "torch_rmsnorm.py", candidate)
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("PYTHONPATH", str(workspace))
    ev = evaluate(task, [CandidateSpec(candidate, {}, "c")], "cpu", shapes=["decode-7x256"])
    assert ev.by_label("c").accepted, ev.by_label("c").reasons
    assert not marker.exists()


def test_a_harness_from_elsewhere_is_refused(tmp_path) -> None:
    with pytest.raises(ImportError, match="not from"):
        _check_harness_origin(str(tmp_path))

"""The loop on the CPU: it searches, keeps only significant wins, writes results and a dispatch
table, and a loop killed with SIGKILL resumes without losing or repeating an experiment."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna

from loop.dispatch import choose, load_dispatch
from loop.driver import LoopConfig, run_loop
from loop.tasks import load_task

FAST = {"samples_per_block": 3, "min_blocks": 4, "max_blocks": 6, "max_time_s": 0.3}
SHAPES = ["decode-7x256", "long-512x1100"]


def test_loop_searches_records_and_dispatches(tmp_path: Path) -> None:
    task = load_task("rmsnorm")
    cfg = LoopConfig(
        task,
        task.folder / "torch_rmsnorm.py",
        "cpu",
        trials=3,
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
        out_dir=tmp_path,
        peers=["eager"],
        rule=FAST,
        shapes=SHAPES,
        seed=1,
    )
    events = []
    result = run_loop(cfg, lambda kind, data: events.append(kind))
    assert result.stop_reason == "trial budget reached"
    assert events[0] == "calibrate" and events[-1] == "final"
    assert result.noise["ci_low"] <= result.noise["ratio"] <= result.noise["ci_high"]
    finished = [t for t in result.trials if t["status"] in ("keep", "discard", "crash")]
    assert len(finished) == 3
    assert len({repr(sorted(t["params"].items())) for t in finished}) == 3
    for t in finished:
        if t["status"] == "keep":
            assert t["speedup"]["ci_low"] > 1.0 + cfg.min_effect
    with (tmp_path / "results.tsv").open() as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 3 and {r["status"] for r in rows} <= {"keep", "discard", "crash"}
    table = load_dispatch(tmp_path / "dispatch-rmsnorm.json")
    assert {e["shape"] for e in table["entries"]} == set(SHAPES)
    assert choose(table, tokens=600, hidden=1000)["shape"] == "long-512x1100"
    assert choose(table, tokens=1, hidden=256)["shape"] == "decode-7x256"
    again = run_loop(cfg)
    assert again.resumed and again.noise == result.noise
    assert len([t for t in again.trials if t["status"] in ("keep", "discard")]) == 3


def _finished(db: Path) -> list[dict]:
    try:
        study = optuna.load_study(
            study_name="rmsnorm/torch_rmsnorm.py/cpu", storage=f"sqlite:///{db}"
        )
    except KeyError:  # the study is not created yet
        return []
    return [
        dict(t.params)
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get("status") in ("keep", "discard", "crash")
    ]


def test_killed_loop_resumes_without_loss_or_repeat(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    cmd = [
        sys.executable,
        "-m",
        "appliance",
        "loop",
        "rmsnorm",
        "--device",
        "cpu",
        "--trials",
        "4",
        "--store",
        f"sqlite:///{db}",
        "--out",
        str(tmp_path),
        "--quick",
        "--json",
    ]
    for shape in SHAPES:
        cmd += ["--shape", shape]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        tsv = tmp_path / "results.tsv"
        if tsv.exists() and len(tsv.read_text().splitlines()) >= 2:  # header + one trial
            break
        time.sleep(0.2)
    time.sleep(1.0)  # let it get into the middle of the next trial
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _finished(db)
    assert 1 <= len(before) < 4
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    after = _finished(db)
    keys = [repr(sorted(p.items())) for p in after]
    assert len(keys) == 4 and len(set(keys)) == 4
    assert all(repr(sorted(p.items())) in keys for p in before)

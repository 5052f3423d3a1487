"""`report compare`: two runs side by side, per shape and per environment field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.report import compare_reports, upgrade
from tests.appliance.report.sample_v2 import sample_v2
from tests.appliance.sample_report import sample_report


def _untuned_host() -> dict:
    """The same GPU a week later, untuned, on another driver; one shape dropped."""
    doc = upgrade(sample_report())
    doc["created"] = "2026-12-06T09:00:00Z"
    doc["fingerprint"]["versions"]["driver"] = "575.57.08"
    doc["fingerprint"]["host"]["hostname"] = "gpu-host-9"
    doc["profile"] = None
    shapes = doc["tasks"][0]["shapes"]
    winner = shapes[2]["winner"]["timing"]
    for key in ("median_s", "ci_low_s", "ci_high_s"):
        winner[key] *= 1.25
    del shapes[3]
    return doc


def test_per_shape_ratio_of_the_times_and_the_environment_differences() -> None:
    a, b = sample_v2(), _untuned_host()
    out = compare_reports(a, b)
    rows = {r["shape"]: r for r in out["shapes"]}
    assert list(rows) == ["decode-1x4096", "4096x4096", "32768x7168"]
    big = rows["32768x7168"]
    assert big["ratio"] == pytest.approx(1 / 1.25)
    assert big["ci_low"] < big["ratio"] < big["ci_high"]
    assert big["a_kernel"] == big["b_kernel"] == "triton_rmsnorm"
    assert rows["4096x4096"]["ratio"] == pytest.approx(1.0)
    assert rows["decode-1x4096"]["a_kernel"] == "torch.compile"  # no winner: the best peer
    assert rows["decode-1x4096"]["peers"] == {"eager": 1.0, "torch.compile": 1.0}
    assert out["only_in_a"] == ["rmsnorm 131072x4096"] and out["only_in_b"] == []
    changed = {d["path"]: (d["a"], d["b"]) for d in out["environment"]}
    assert changed["fingerprint/versions/driver"] == ("580.159.04", "575.57.08")
    assert changed["fingerprint/host/hostname"] == ("gpu-host-7", "gpu-host-9")
    assert changed["profile/name"] == ("h200-sxm-locked", None)
    assert "fingerprint/gpus/0/name" not in changed
    assert out["gains"]["end_to_end"]["a"]["ratio"] == 2.02
    assert out["gains"]["end_to_end"]["b"] is None
    assert out["a"]["profile_mode"] == "applied" and out["b"]["profile"] is None


def test_a_report_compared_with_itself_has_ratio_one_and_no_differences() -> None:
    out = compare_reports(sample_v2(), sample_v2())
    assert out["environment"] == []
    assert {r["ratio"] for r in out["shapes"]} == {1.0}


def test_cli_compare_reads_v1_and_v2_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(sample_v2()))
    v1 = sample_report()
    v1["fingerprint"]["versions"]["torch"] = "2.12.0"
    b.write_text(json.dumps(v1))
    cmd = [sys.executable, "-m", "appliance", "report", "compare", str(a), str(b)]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["shapes"]) == 4
    assert {"path": "fingerprint/versions/torch", "a": "2.11.0+cu130", "b": "2.12.0"} in out[
        "environment"
    ]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0
    assert "fingerprint/versions/torch" in text.stdout and "32768x7168" in text.stdout

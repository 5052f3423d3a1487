"""The main job end to end on the CPU: every stage runs and the report validates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from appliance.report import validate_file


def test_run_writes_a_valid_report_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "run", "--out", str(out), "--trials", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["valid"] and summary["errors"] == []
    assert validate_file(out / "report.json") == []
    report = json.loads((out / "report.json").read_text())
    assert report["host"]["gpu_present"] is False or report["tasks"][0]["device"] == "cuda"
    task = report["tasks"][0]
    assert task["task"] == "rmsnorm" and task["trials"] == 2
    assert {s["name"] for s in task["shapes"]} == {e["shapes"][0] for e in task["dispatch"]}
    for shape in task["shapes"]:
        assert shape["incumbent"]["median_s"] > 0
        assert "eager" in shape["peers"]
    assert report["baselines"]["metrics"] and report["noise"]["noise_floor"] >= 0
    assert report["schema_version"] == "2"
    assert "autotune run" in report["reproduce"]["command"]
    assert "report verify" in report["reproduce"]["verify_command"]
    for shape in task["shapes"]:
        spec = shape["incumbent_spec"]
        assert spec["candidate"] == "torch_rmsnorm" and len(spec["sha256"]) == 64
    assert report["loop"]["proposals"]["tried"] == 2
    markdown = (out / "report.md").read_text()
    assert "rmsnorm" in markdown
    html = (out / "report.html").read_text()
    assert "<svg" in html and "rmsnorm" in html
    assert (out / "results.tsv").exists() and (out / "dispatch-rmsnorm.json").exists()


def test_run_again_resumes_the_same_store(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "appliance", "run", "--out", str(out), "--trials", "1", "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["loop"]["resumed"] is True

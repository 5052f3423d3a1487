"""scripts/baseline_repro.py: two real suite runs in separate processes, and the agreement rule."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from baselines.suite import Metric
from tests.source_files import import_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "baseline_repro.py"


repro = import_file(SCRIPT)


def metric(value: float, low: float, high: float, higher: bool = True) -> Metric:
    return Metric("m", "us", value, low, high, 5, higher, "m")


def test_overlapping_intervals_agree() -> None:
    row = repro.agreement(metric(10.0, 9.5, 10.5), metric(10.4, 10.2, 10.9))
    assert row.agrees and row.overlap
    assert not row.each_inside_other  # 10.0 is outside the second interval
    assert row.rel_diff == pytest.approx(0.04)
    value, low, high = row.ratio
    assert value == pytest.approx(1.04)
    assert low < value < high


def test_disjoint_intervals_disagree_either_direction() -> None:
    for higher in (True, False):
        row = repro.agreement(metric(10.0, 9.9, 10.1, higher), metric(11.0, 10.9, 11.1, higher))
        assert not row.agrees
        assert row.ratio[0] == pytest.approx(1.1)  # raw second over first, whatever is better


def test_two_real_runs_and_doctored_files(tmp_path: Path) -> None:
    out = tmp_path / "repro.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(out.read_text())
    names = {m["name"] for m in report["metrics"]}
    assert names == {"host_memory_bandwidth", "cpu_fp32_gemm", "torch_op_overhead"}
    assert report["agree"] == (proc.returncode == 0) == (not report["disagreeing"])
    assert "metrics within their intervals" in proc.stdout
    first, second = (Path(r["file"]) for r in report["runs"])
    assert first.exists() and second.exists() and first != second

    doc = json.loads(first.read_text())
    assert repro.main([str(tmp_path / "same.json"), "--files", str(first), str(first)]) == 0
    moved = copy.deepcopy(doc)
    m = moved["metrics"][0]
    width = m["ci_high"] - m["ci_low"]
    for key in ("value", "ci_low", "ci_high"):
        m[key] += 2 * width + 1
    assert (
        repro.main([str(tmp_path / "moved.json"), "--files", str(first), _write(tmp_path, moved)])
        == 1
    )
    report = json.loads((tmp_path / "moved.json").read_text())
    assert report["disagreeing"] == [m["name"]]
    fewer = {**doc, "metrics": doc["metrics"][1:]}
    assert (
        repro.main([str(tmp_path / "fewer.json"), "--files", str(first), _write(tmp_path, fewer)])
        == 1
    )
    assert json.loads((tmp_path / "fewer.json").read_text())["only_in_first"] == [m["name"]]


def _write(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / f"doc{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_unreadable_inputs_exit_2(tmp_path: Path, capsys) -> None:
    assert (
        repro.main([str(tmp_path / "o.json"), "--files", "/nonexistent/a", "/nonexistent/b"]) == 2
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other/1"}))
    assert repro.main([str(tmp_path / "o.json"), "--files", str(bad), str(bad)]) == 2
    assert "schema" in capsys.readouterr().err

"""`autotune report verify` for real: a CPU report re-measured through the evaluator."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from appliance.report import load_report, validate_report
from appliance.report.claims import NOT_COMPARABLE, NOT_REPRODUCED, REPRODUCED
from appliance.report.verify import verify_report
from loop.tasks import load_task
from tests.appliance.report.sample_v2 import sample_v2

STATUSES = {REPRODUCED, NOT_REPRODUCED, NOT_COMPARABLE}


def _verify(path: Path, *extra: str) -> tuple[int, dict]:
    cmd = [sys.executable, "-m", "appliance", "report", "verify", str(path), "--json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def test_verify_a_real_cpu_report_accounts_for_every_shape(
    cpu_run: Path, here_fingerprint: dict
) -> None:
    report = load_report(cpu_run / "report.json")
    result = verify_report(report, here_fingerprint=here_fingerprint, quick=True)
    out = result.to_dict()
    shapes = {(t["task"], s["name"]) for t in report["tasks"] for s in t["shapes"]}
    claimed = {(c["task"], c["shape"]) for c in out["claims"]}
    noted = {tuple(n.split(":", 1)[0].split(" ", 1)) for n in out["notes"]}
    assert claimed | noted == shapes and not claimed & noted
    for claim in out["claims"]:
        assert claim["status"] in STATUSES
        assert claim["device"] == "cpu"
        if claim["status"] != NOT_COMPARABLE:
            assert f"claimed {claim['ratio']:.3f}x" in claim["why"]
    assert out["holds"] == (out["counts"][NOT_REPRODUCED] == 0 and out["counts"][REPRODUCED] > 0)
    assert sum(out["counts"].values()) == len(out["claims"])
    named = any(s.get("incumbent_spec") for t in report["tasks"] for s in t["shapes"])
    if named:  # once the pipeline names what it timed, every shape with a peer is a claim
        assert claimed


def _claims_on_the_real_report(cpu_run: Path) -> dict:
    """The real report with three claims written in: one surely true, one surely false, one
    about a candidate file that has changed since."""
    doc = load_report(cpu_run / "report.json")
    task = load_task("rmsnorm")
    path = task.folder / "torch_rmsnorm.py"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    shapes = doc["tasks"][0]["shapes"]
    claims = [  # judged with a tolerance of 1 (2x either way): the first is surely true
        ({}, digest, {"ratio": 1.0, "ci_low": 0.9, "ci_high": 1.1}),
        ({}, digest, {"ratio": 40.0, "ci_low": 38.0, "ci_high": 42.0}),
        ({"method": "vector_norm"}, "0" * 64, {"ratio": 1.0, "ci_low": 0.9, "ci_high": 1.1}),
    ]
    for shape, (params, sha, ratio) in zip(shapes, claims, strict=False):
        shape["best_peer"] = "eager"
        shape["incumbent_spec"] = {"candidate": "torch_rmsnorm", "params": params, "sha256": sha}
        shape["incumbent_speedup_vs_best_peer"] = ratio
        shape["winner"] = None  # its shown speedup would be a claim of its own
    for shape in shapes[3:]:
        shape["peers"] = {}
        shape["best_peer"] = None
        shape["incumbent_speedup_vs_best_peer"] = None
    assert validate_report(doc) == []
    return doc


def test_verify_re_measures_claims_and_tells_true_from_false(
    cpu_run: Path, here_fingerprint: dict
) -> None:
    doc = _claims_on_the_real_report(cpu_run)
    result = verify_report(doc, here_fingerprint=here_fingerprint, quick=True, tolerance=1.0)
    by_shape = {r.claim.shape: r for r in result.results}
    names = [s["name"] for s in doc["tasks"][0]["shapes"]]
    assert list(by_shape) == names[:3]
    true, false, changed = (by_shape[n] for n in names[:3])
    assert true.status == REPRODUCED, true.why
    assert false.status == NOT_REPRODUCED
    assert "claimed 40.000x [38.000, 42.000], measured" in false.why
    assert 0 < false.measured.ratio < 38
    assert changed.status == NOT_COMPARABLE
    assert "torch_rmsnorm.py changed since the report" in changed.why
    assert all("no peer was timed" in n for n in result.notes)
    assert not result.holds
    assert result.counts() == {REPRODUCED: 1, NOT_REPRODUCED: 1, NOT_COMPARABLE: 1}


def test_verify_a_report_from_another_gpu_says_not_comparable_and_which(tmp_path: Path) -> None:
    doc = sample_v2()
    doc["fingerprint"]["gpus"][0]["name"] = "NVIDIA Imaginary 9000"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    rc, out = _verify(path)
    assert rc == 1 and out["holds"] is False
    assert out["claims"] and {c["status"] for c in out["claims"]} == {NOT_COMPARABLE}
    assert all("NVIDIA Imaginary 9000" in c["why"] for c in out["claims"])


def test_verify_refuses_an_invalid_report_naming_the_path(tmp_path: Path) -> None:
    doc = sample_v2()
    doc["tasks"][0]["shapes"][1]["incumbent_spec"]["params"] = "BLOCK=4096"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "report", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "tasks/0/shapes/1/incumbent_spec/params" in done.stderr
    assert "Traceback" not in done.stderr

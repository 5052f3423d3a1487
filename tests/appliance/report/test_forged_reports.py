"""Forged and hostile reports (the fifteenth red team, 2026-12-07): what a report says about
itself never makes `report verify` say "reproduced", and values no measurement gives are refused
by `report validate` with the field named instead of crashing a command later."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from appliance.report import validate_report
from appliance.report.claims import (
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Measured,
    claims_of,
    judge,
)
from appliance.report.schema import validate_file
from appliance.report.verify import MAX_REPORT_TOLERANCE, _groups, _measure, verify_report
from tests.appliance.report.sample_v2 import sample_v2


def _claim(ratio: float, lo: float, hi: float, **kw) -> Claim:
    fields = {"task": "rmsnorm", "shape": "8x64", "device": "cpu", "candidate": "torch_rmsnorm"}
    fields.update(kw)
    return Claim(params={}, peer="eager", ratio=ratio, ci_low=lo, ci_high=hi, basis="x", **fields)


def test_a_wide_claimed_interval_does_not_reproduce_whatever_is_measured() -> None:
    measured = Measured(0.93, 0.90, 0.96)
    assert judge(_claim(50.0, 0.5, 100.0), measured, [], 0.01).status == NOT_REPRODUCED
    assert judge(_claim(0.94, 0.92, 0.96), measured, [], 0.01).status == REPRODUCED


def test_the_winners_shown_speedup_is_a_claim_too_not_only_the_incumbents() -> None:
    doc = sample_v2()
    before = claims_of(doc)[0]
    shape = doc["tasks"][0]["shapes"][2]
    shape["winner"]["speedup_vs_best_peer"] = {"ratio": 8.0, "ci_low": 7.9, "ci_high": 8.1}
    del shape["winner"]["sha256"]  # as in the red team's report: the incumbent's file stands
    claims = claims_of(doc)[0]
    assert len(claims) == len(before) + 1
    (eight,) = [c for c in claims if c.ratio == 8.0]
    assert (eight.shape, eight.candidate) == (shape["name"], shape["winner"]["candidate"])
    incumbent_claim = next(c for c in claims if c.shape == eight.shape and c is not eight)
    assert eight.sha256 == incumbent_claim.sha256  # the same file: measured once, checked once
    assert len(_groups([incumbent_claim, eight])) == 1
    incumbent = shape["incumbent_speedup_vs_best_peer"]["ratio"]
    measured = Measured(incumbent, incumbent * 0.99, incumbent * 1.01)
    assert judge(eight, measured, [], 0.01).status == NOT_REPRODUCED


def test_the_report_cannot_loosen_its_own_tolerance() -> None:
    doc = sample_v2()  # a GPU report: judged not comparable on a host without one, no timing
    doc["noise"]["noise_floor"] = 2.0
    here = json.loads(json.dumps(doc["fingerprint"]))
    here["gpus"] = []
    assert verify_report(doc, here_fingerprint=here).tolerance == MAX_REPORT_TOLERANCE
    assert verify_report(doc, here_fingerprint=here, tolerance=0.9).tolerance == 0.9


def test_each_claimed_sha256_is_checked_not_only_a_groups_first() -> None:
    plain = _claim(1.0, 0.9, 1.1, shape="a")
    wrong = _claim(1.0, 0.9, 1.1, shape="b", sha256="a" * 64)
    assert [len(g) for g in _groups([plain, wrong])] == [1, 1]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"task": "/tmp/elsewhere/rmsnorm"}, "not one of this install's tasks"),
        ({"task": "../rmsnorm"}, "not one of this install's tasks"),
        ({"candidate": "/tmp/outside"}, "not a file name in the task folder"),
        ({"candidate": "../rope/torch_rope"}, "not a file name in the task folder"),
    ],
)
def test_a_claim_names_an_installed_task_and_a_file_of_its_folder(fields: dict, said: str) -> None:
    measured, failures, differences = _measure([_claim(1.0, 0.9, 1.1, **fields)], quick=True)
    assert measured == {} and failures == {}
    assert len(differences) == 1 and said in differences[0]


def test_a_task_folder_in_the_working_directory_does_not_shadow_the_installed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rmsnorm").mkdir()
    (tmp_path / "rmsnorm" / "task.py").write_text("raise SystemExit('the shadow task ran')\n")
    monkeypatch.chdir(tmp_path)
    claim = _claim(1.0, 0.9, 1.1, candidate="no_such_candidate")
    _, _, differences = _measure([claim], quick=True)
    assert len(differences) == 1 and "no_such_candidate.py is not here" in differences[0]
    assert str(tmp_path) not in differences[0]


def _errors(doc: dict) -> dict[str, str]:
    return {e.path: e.message for e in validate_report(doc)}


def test_a_shape_or_task_twice_is_refused_naming_it() -> None:
    doc = sample_v2()
    shapes = doc["tasks"][0]["shapes"]
    shapes.append(json.loads(json.dumps(shapes[0])))
    assert _errors(doc) == {
        f"tasks/0/shapes/{len(shapes) - 1}/name": "shape 'decode-1x4096' appears twice"
    }
    doc = sample_v2()
    doc["tasks"].append(json.loads(json.dumps(doc["tasks"][0])))
    assert "tasks/1/task" in _errors(doc)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (0.0, "a time must be above 0 s"),
        (10**400, "the number is beyond 1e+100"),
        (1.7e308, "the number is beyond 1e+100"),
    ],
    ids=["zero", "huge-int", "huge-float"],
)
def test_times_no_measurement_gives_are_refused(value: float, said: str) -> None:
    doc = sample_v2()
    timing = doc["tasks"][0]["shapes"][0]["peers"]["eager"]
    timing["ci_low_s"] = value
    if value:
        timing["median_s"] = timing["ci_high_s"] = value
    errors = _errors(doc)
    assert said in errors.values(), errors


def test_text_that_is_not_unicode_is_refused_naming_the_field() -> None:
    doc = sample_v2()
    doc["fingerprint"]["host"]["hostname"] = "a\ud800b"
    assert _errors(doc) == {
        "fingerprint/host/hostname": "the text is not valid Unicode (a lone surrogate)"
    }


def test_files_no_report_is_in_are_refused_without_blocking_or_crashing(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    (error,) = validate_file(deep)
    assert error.path == "(file)" and "nested too deep" in error.message
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (error,) = validate_file(fifo)
    assert error.message == f"cannot read {fifo}: not a regular file"

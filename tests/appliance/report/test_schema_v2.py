"""Schema version 2: its new blocks are typed and optional, bad values are named by path, and a
version 1 report upgrades in memory to a valid version 2 one."""

from __future__ import annotations

import copy

import pytest

from appliance.report import SCHEMA_VERSION, checked, upgrade, validate_report
from appliance.report.document import InvalidReport
from tests.appliance.report.doc_paths import delete_at, set_at
from tests.appliance.report.sample_v2 import sample_v2
from tests.appliance.sample_report import sample_report


def test_current_version_is_2_and_the_full_sample_is_valid() -> None:
    assert SCHEMA_VERSION == "2"
    doc = sample_v2()
    assert doc["schema_version"] == "2"
    assert validate_report(doc) == []


def test_a_cpu_run_leaves_every_new_block_out_and_is_still_valid() -> None:
    doc = sample_v2()
    del doc["telemetry"], doc["gains"], doc["baselines"]["comparison"], doc["loop"]["proposals"]
    doc["profile"] = None
    task = doc["tasks"][0]
    for key in ("ceilings", "dispatch_file", "kept"):
        del task[key]
    for shape in task["shapes"]:
        for key in ("best_peer", "incumbent_spec", "incumbent_speedup_vs_best_peer"):
            shape.pop(key, None)
        if shape["winner"]:
            del shape["winner"]["timing"]["telemetry"]
    for key in ("samples", "sample_unit", "ratio"):
        del doc["noise"][key]
    assert validate_report(doc) == []
    doc["telemetry"] = None
    doc["baselines"]["comparison"] = None
    doc["tasks"][0]["ceilings"] = None
    doc["gains"] = {"hardware": None, "kernel": None, "end_to_end": None}
    assert validate_report(doc) == []


def test_upgrade_turns_a_v1_report_into_a_valid_v2_one() -> None:
    v1 = sample_report()
    v1["noise"]["ratios"] = [0.999, 1.0, 1.001]
    v1["gains"]["end_to_end"] = {"ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1, "n_blocks": 12}
    v1["tasks"][0]["shapes"][1]["winner"]["timing"]["telemetry"]["vendor_field"] = 3
    before = copy.deepcopy(v1)
    v2 = upgrade(v1)
    assert v1 == before, "upgrade must not change its argument"
    assert validate_report(v2) == []
    assert v2["schema_version"] == "2" and "command" not in v2
    assert v2["reproduce"] == {"command": v1["command"]}
    assert v2["noise"]["samples"] == [0.999, 1.0, 1.001]
    assert v2["noise"]["sample_unit"] == "decision"
    e2e = v2["gains"]["end_to_end"]
    assert e2e["combined"] == v1["gains"]["end_to_end"]
    assert e2e["kernel_only"] == v1["gains"]["kernel"]
    assert e2e["hardware_only"] is None
    proposals = v2["loop"]["proposals"]
    task = v1["tasks"][0]
    assert proposals["tried"] == task["trials"]
    assert proposals["accepted"] == task["accepted"]
    assert proposals["rejected_by_reason"] == task["rejected_by_reason"]
    telemetry = v2["tasks"][0]["shapes"][1]["winner"]["timing"]["telemetry"]
    assert "vendor_field" not in telemetry and telemetry["sm_clock_mhz"]["max"] == 1980


def test_upgrading_a_current_report_changes_nothing() -> None:
    doc = sample_v2()
    assert upgrade(doc) == doc
    assert upgrade(doc) is not doc


def test_v1_reports_are_still_checked_against_v1() -> None:
    doc = sample_report()
    doc["reproduce"] = {"command": "x"}
    assert [(e.path, e.message) for e in validate_report(doc)] == [
        ("reproduce", "unexpected field")
    ]
    with pytest.raises(InvalidReport):
        checked(doc)


END = "gains/end_to_end"
SHAPE = "tasks/0/shapes/2"

MUTATIONS = [
    # (path to set, value, expected error path, expected words)
    ("reproduce/command", "", "reproduce/command", "should be non-empty"),
    ("reproduce/env/CUDA_VISIBLE_DEVICES", 0, "reproduce/env/CUDA_VISIBLE_DEVICES", "not of type"),
    ("profile/applied_at", "noon", "profile/applied_at", "ISO 8601"),
    ("profile/changes/0/status", "undone", "profile/changes/0/status", "is not one of"),
    ("profile/restore_errors", "none", "profile/restore_errors", "not of type 'array'"),
    ("noise/samples/3", 0, "noise/samples/3", "less than or equal to the minimum"),
    ("noise/sample_unit", "run", "noise/sample_unit", "is not one of"),
    ("telemetry/samples/2/t_s", -1, "telemetry/samples/2/t_s", "less than the minimum"),
    ("telemetry/samples/2/fan", 50, "telemetry/samples/2/fan", "unexpected field"),
    (
        f"{SHAPE}/winner/timing/telemetry/fan",
        1,
        f"{SHAPE}/winner/timing/telemetry/fan",
        "unexpected",
    ),
    (
        f"{SHAPE}/winner/timing/telemetry/remeasured/0/block",
        "seven",
        f"{SHAPE}/winner/timing/telemetry/remeasured/0/block",
        "not of type 'integer'",
    ),
    (f"{SHAPE}/best_peer", "cublas", f"{SHAPE}/best_peer", "has no timing here"),
    (f"{SHAPE}/incumbent_spec/sha256", "xyz", f"{SHAPE}/incumbent_spec/sha256", "SHA-256"),
    (
        f"{SHAPE}/incumbent_speedup_vs_best_peer/ci_low",
        3.0,
        f"{SHAPE}/incumbent_speedup_vs_best_peer",
        "interval out of order",
    ),
    ("tasks/0/ceilings/bytes_per_s", "fast", "tasks/0/ceilings/bytes_per_s", "not of type"),
    ("tasks/0/kept", -1, "tasks/0/kept", "less than the minimum"),
    (f"{END}/combined/ci_high", 1.0, f"{END}/combined", "interval out of order"),
    (f"{END}/tuned/host", "", f"{END}/tuned/host", "should be non-empty"),
    (f"{END}/product_of_ratios", 2.0, f"{END}/product_of_ratios", "unexpected field"),
    ("gains/hardware/ratio", 0, "gains/hardware/ratio", "less than or equal to the minimum"),
    (
        "baselines/comparison/metrics/0/ci_low",
        1.5,
        "baselines/comparison/metrics/0",
        "out of order",
    ),
    ("baselines/comparison/metrics/1/a/n", 0, "baselines/comparison/metrics/1/a/n", "minimum"),
    ("loop/proposals/rejected", 35, "loop/proposals", "exceeds tried"),
    ("loop/proposals/kept", 7, "loop/proposals/kept", "exceeds accepted"),
    (
        "loop/proposals/rejected_by_reason/Not Faster",
        1,
        "loop/proposals/rejected_by_reason",
        "code",
    ),
]


@pytest.mark.parametrize(("path", "value", "where", "words"), MUTATIONS)
def test_a_bad_v2_value_gives_an_error_naming_its_path(
    path: str, value: object, where: str, words: str
) -> None:
    doc = sample_v2()
    set_at(doc, path, value)
    errors = validate_report(doc)
    assert where in [e.path for e in errors], errors
    assert any(words in e.message for e in errors if e.path == where), errors


def test_reason_counts_must_cover_the_rejected_proposals() -> None:
    doc = sample_v2()
    doc["loop"]["proposals"]["rejected_by_reason"] = {"wrong-result": 1}
    (error,) = validate_report(doc)
    assert error.path == "loop/proposals/rejected_by_reason"
    assert "fewer than the 34 rejected" in error.message


@pytest.mark.parametrize(
    "path",
    [
        "reproduce/command",
        f"{END}/combined",
        f"{END}/hardware_only",
        f"{END}/baseline/kernels",
        "telemetry/samples/0/t_s",
        "loop/proposals/tried",
        "tasks/0/ceilings/flops_per_s",
        f"{SHAPE}/incumbent_spec/params",
    ],
)
def test_a_missing_required_v2_field_is_named(path: str) -> None:
    doc = sample_v2()
    delete_at(doc, path)
    assert [(e.path, e.message) for e in validate_report(doc)] == [
        (path, "required field is missing")
    ]

"""The report schema: it ships in the package, accepts a real report, and names failing paths."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from appliance.report import SCHEMA_VERSION, load_schema, validate_file, validate_report
from appliance.report.schema import SCHEMA_FILES, ReportError
from tests.appliance.report.doc_paths import delete_at, set_at
from tests.appliance.sample_report import sample_report


def _paths(errors: list[ReportError]) -> list[str]:
    return [e.path for e in errors]


def test_every_shipped_version_is_a_valid_2020_12_schema_for_its_own_version() -> None:
    assert SCHEMA_VERSION in SCHEMA_FILES
    for version, filename in SCHEMA_FILES.items():
        shipped = resources.files("appliance.report").joinpath("schemas", filename)
        assert shipped.is_file()
        schema = load_schema(version)
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"]
        assert schema["properties"]["schema_version"]["const"] == version


def test_load_schema_gives_a_copy_and_rejects_unknown_versions() -> None:
    load_schema()["properties"].clear()
    assert "tasks" in load_schema()["properties"]
    with pytest.raises(ValueError, match="'99'"):
        load_schema("99")


def test_sample_report_is_valid() -> None:
    assert validate_report(sample_report()) == []


def test_open_and_nullable_parts_accept_what_they_promise() -> None:
    doc = sample_report()
    doc["host"]["facts"]["anything"] = {"nested": [1, "two", None]}
    doc["host"]["checks"][0]["title"] = "PCIe link"
    doc["profile"] = None
    doc["noise"] = None
    doc["tasks"][0]["shapes"][1]["winner"] = None
    doc["tasks"][0]["shapes"][1]["incumbent"] = None
    del doc["gains"]
    doc["fingerprint"]["gpus"] = []
    assert validate_report(doc) == []


WINNER = "tasks/0/shapes/2/winner"

MUTATIONS = [
    # (path to set, value, expected error path, expected words)
    (
        f"{WINNER}/timing/median_s",
        -1,
        f"{WINNER}/timing/median_s",
        "-1 is less than the minimum of 0",
    ),
    ("tasks/0/trials", "40", "tasks/0/trials", "is not of type 'integer'"),
    ("baselines/metrics/0/value", "4.27", "baselines/metrics/0/value", "is not of type 'number'"),
    (f"{WINNER}/timing/method", "wallclock", f"{WINNER}/timing/method", "is not one of"),
    ("tasks/0/dispatch/0/source", "peers", "tasks/0/dispatch/0/source", "is not one of"),
    ("baselines/environment/kind", "cloud", "baselines/environment/kind", "is not one of"),
    ("host/checks/1/status", "ok", "host/checks/1/status", "is not one of"),
    ("tasks/0/shapes/1/incumbent", "fast", "tasks/0/shapes/1/incumbent", "expected timing or null"),
    ("tasks/0/shapes/0/winner", [], "tasks/0/shapes/0/winner", "expected winner or null"),
    ("created", "yesterday", "created", "ISO 8601"),
    ("fingerprint/git/commit", "HEAD", "fingerprint/git/commit", "commit hash"),
    ("fingerprint/locks/uv_lock_sha256", "abc", "fingerprint/locks/uv_lock_sha256", "SHA-256"),
    ("tasks/0/rejected_by_reason/Bad Code", 1, "tasks/0/rejected_by_reason", "reason code"),
    ("noise/aa_ratio_ci", [1.0], "noise/aa_ratio_ci", "too short"),
    ("fingerprint/git/comit", "abc1234", "fingerprint/git/comit", "unexpected field"),
    (f"{WINNER}/speedup", 2.0, f"{WINNER}/speedup", "unexpected field"),
    ("baselines/metrics/1/value", float("nan"), "baselines/metrics/1/value", "not a finite number"),
    (f"{WINNER}/timing/ci_low_s", 1.0, f"{WINNER}/timing", "interval out of order"),
    (
        f"{WINNER}/speedup_vs_best_peer/ci_high",
        1.5,
        f"{WINNER}/speedup_vs_best_peer",
        "out of order",
    ),
    ("noise/aa_ratio_ci", [1.01, 0.99], "noise/aa_ratio_ci", "above high end"),
    ("tasks/0/dispatch/0/candidate", "cublas", "tasks/0/dispatch/0/candidate", "not measured"),
]


@pytest.mark.parametrize(("path", "value", "where", "words"), MUTATIONS)
def test_a_bad_value_gives_an_error_naming_its_path(
    path: str, value: object, where: str, words: str
) -> None:
    doc = sample_report()
    set_at(doc, path, value)
    errors = validate_report(doc)
    assert where in _paths(errors), errors
    assert any(words in e.message for e in errors if e.path == where), errors


def test_negative_time_error_reads_as_path_then_reason() -> None:
    doc = sample_report()
    set_at(doc, f"{WINNER}/timing/median_s", -1)
    assert [str(e) for e in validate_report(doc)] == [
        f"{WINNER}/timing/median_s: -1 is less than the minimum of 0"
    ]


@pytest.mark.parametrize(
    "path",
    [
        "command",
        "fingerprint/versions/torch",
        "host/checks/0/severity",
        "tasks/0/shapes/1/winner/timing/n_blocks",
        "tasks/0/shapes/1/peers/eager/ci_high_s",
        "loop/stop_reason",
    ],
)
def test_a_missing_required_field_is_named(path: str) -> None:
    doc = sample_report()
    delete_at(doc, path)
    errors = validate_report(doc)
    assert [(e.path, e.message) for e in errors] == [(path, "required field is missing")]


def test_every_missing_field_of_an_empty_timing_is_listed() -> None:
    doc = sample_report()
    set_at(doc, "tasks/0/shapes/1/incumbent", {"median_s": 1e-5})
    missing = {e.path.rsplit("/", 1)[1] for e in validate_report(doc)}
    assert missing == {"ci_low_s", "ci_high_s", "n_blocks", "n_samples", "method"}


@pytest.mark.parametrize(("version", "words"), [("9", "'9'"), (1, "1"), ("", "''")])
def test_unknown_schema_version_is_an_error_not_a_crash(version: object, words: str) -> None:
    doc = sample_report()
    doc["schema_version"] = version
    errors = validate_report(doc)
    assert _paths(errors) == ["schema_version"]
    assert words in errors[0].message
    assert "'1'" in errors[0].message


def test_missing_schema_version_and_non_object_documents() -> None:
    doc = sample_report()
    del doc["schema_version"]
    assert _paths(validate_report(doc)) == ["schema_version"]
    (error,) = validate_report([sample_report()])
    assert error.path == "(root)"
    assert "array" in error.message


def test_validate_file_accepts_a_written_report(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(sample_report(), indent=2))
    assert validate_file(path) == []
    assert validate_file(str(path)) == []


def test_validate_file_reports_invalid_content_by_path(tmp_path: Path) -> None:
    doc = sample_report()
    doc["loop"]["resumed"] = "no"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    assert _paths(validate_file(path)) == ["loop/resumed"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"schema_version": "1",\n "command": }', "not JSON"),
        (b"", "not JSON"),
        (b'{"schema_version": "1", "x": NaN}', "NaN is not a JSON number"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
    ],
)
def test_validate_file_reports_bad_files_without_a_traceback(
    tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "report.json"
    path.write_bytes(content)
    (error,) = validate_file(path)
    assert error.path == "(file)"
    assert words in error.message
    assert str(path) in error.message


def test_validate_file_names_the_line_of_a_json_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text('{"schema_version": "1",\n "command": }')
    (error,) = validate_file(path)
    assert "line 2" in error.message


def test_validate_file_reports_unreadable_paths(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.json", tmp_path):
        (error,) = validate_file(path)
        assert error.path == "(file)"
        assert error.message.startswith(f"cannot read {path}")


def test_validate_file_reports_unknown_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**sample_report(), "schema_version": "99"}))
    assert _paths(validate_file(path)) == ["schema_version"]

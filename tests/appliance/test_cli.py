"""The command line as a user meets it: exit codes, --json, clear errors instead of tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loop.tasks import kernels_root

CANDIDATES = Path(__file__).resolve().parents[1] / "loop" / "candidates"


def autotune(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def test_help_lists_every_stage() -> None:
    result = autotune("--help")
    assert result.returncode == 0
    for command in ("run", "host", "baseline", "verify", "bench", "loop", "report", "tasks"):
        assert command in result.stdout


def test_verify_accepts_an_honest_candidate_with_json() -> None:
    result = autotune(
        "verify", "rmsnorm", "torch_rmsnorm.py", "--params", '{"chunk_rows": 64}', "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"] == "accepted" and data["reasons"] == []
    assert data["device"] == "cpu" and data["params"] == {"chunk_rows": 64}


def test_verify_rejects_with_reason_codes_and_exit_1() -> None:
    result = autotune("verify", "rmsnorm", str(CANDIDATES / "returns_zeros.py"), "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["verdict"] == "rejected"
    assert "constant-output" in {r["code"] for r in data["reasons"]}


def test_task_given_as_a_folder_path() -> None:
    folder = kernels_root() / "rmsnorm"
    result = autotune("verify", str(folder), "torch_rmsnorm.py", "--json")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("verify", "no-such-task", "x.py"), "unknown task 'no-such-task'"),
        (("verify", "rmsnorm", "missing.py"), "is not a file"),
        (("verify", "rmsnorm", "torch_rmsnorm.py", "--params", "{oops"), "--params is not JSON"),
        (("verify", "rmsnorm", "torch_rmsnorm.py", "--params", "[1]"), "must be a JSON object"),
        (("bench", "rmsnorm", "torch_rmsnorm.py", "--shape", "huge"), "unknown shape"),
        (("bench", "rmsnorm", "torch_rmsnorm.py", "--peer", "cudnn"), "unknown peer"),
        (("report", "validate", "/nonexistent/report.json"), "cannot read"),
        (("run", "--task", "allreduce", "--out", "/tmp"), "no single-process candidate"),
        # checked before the work they would otherwise end
        (("baseline", "--quick", "--out", "/proc/baseline.json"), "--out /proc"),
        (("loop", "rmsnorm", "--proposer", "scripted", "--script", "/nonexistent"), "not a folder"),
        (
            ("loop", "rmsnorm", "--proposer", "agent", "--agent-command", 'agent "{brief}'),
            "cannot be split",
        ),
    ],
)
def test_bad_input_is_a_one_line_error_not_a_traceback(args, message) -> None:
    result = autotune(*args)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    assert message in result.stderr


def test_fleet_run_checks_the_task_names_before_any_host(tmp_path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[hosts]]\nhost = "nonexistent.invalid"\n')
    result = autotune("fleet", "run", "--hosts", str(hosts), "--task", "no-such-task")
    assert result.returncode == 2 and "unknown task 'no-such-task'" in result.stderr


def test_malformed_report_json_is_bad_input_and_an_invalid_one_is_rejected(tmp_path) -> None:
    (tmp_path / "cut.json").write_text('{"schema_version": ')
    (tmp_path / "wrong.json").write_text('{"schema_version": "nope"}')
    cut = autotune("report", "validate", str(tmp_path / "cut.json"), "--json")
    wrong = autotune("report", "validate", str(tmp_path / "wrong.json"), "--json")
    assert cut.returncode == 2 and "is not JSON" in json.loads(cut.stdout)["errors"][0]
    assert wrong.returncode == 1 and not json.loads(wrong.stdout)["valid"]


def test_an_unexpected_failure_is_exit_3_with_its_traceback() -> None:
    """An exception no command turns into a verdict is the tool's own failure (exit 3), told
    apart from a rejection (exit 1); here the task listing meets a bug."""
    bug = (
        "import loop.tasks\n"
        "def broken():\n"
        "    raise RuntimeError('a bug in the tool')\n"
        "loop.tasks.available_tasks = broken\n"
        "from appliance.cli import main\n"
        "main(['tasks'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", bug], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 3, result.stderr
    assert "Traceback" in result.stderr and "internal error" in result.stderr


def test_candidate_with_syntax_error_is_rejected_with_its_code() -> None:
    result = autotune("verify", "rmsnorm", str(CANDIDATES / "syntax_error.py"), "--json")
    assert result.returncode == 1
    assert [r["code"] for r in json.loads(result.stdout)["reasons"]] == ["syntax-error"]


def test_results_go_to_stdout_and_errors_to_stderr() -> None:
    """`autotune host profiles > file` keeps the table; an error is not mixed into it."""
    verified = autotune("verify", "rmsnorm", "torch_rmsnorm.py")
    assert verified.returncode == 0 and "accepted" in verified.stdout
    assert "accepted" not in verified.stderr
    profiles = autotune("host", "profiles")
    assert profiles.returncode == 0 and "overclock" in profiles.stdout
    missing = autotune("verify", "rmsnorm", "missing.py")
    assert missing.returncode == 2 and missing.stdout == "" and "is not a file" in missing.stderr


def test_a_candidate_that_is_not_utf8_is_rejected_with_its_code(tmp_path) -> None:
    latin1 = tmp_path / "latin1.py"
    latin1.write_bytes(
        b'"""caf\xe9"""\nLANGUAGE = "torch"\n\n\ndef kernel(x, weight):\n    return x\n'
    )
    result = autotune("verify", "rmsnorm", str(latin1), "--json")
    assert result.returncode == 1, result.stderr
    reasons = json.loads(result.stdout)["reasons"]
    assert reasons[0]["code"] == "syntax-error" and "not UTF-8" in reasons[0]["message"]


def test_unknown_params_are_rejected_naming_the_parameter() -> None:
    result = autotune(
        "verify", "rmsnorm", "torch_rmsnorm.py", "--params", '{"blocks": 2}', "--json"
    )
    assert result.returncode == 1
    reasons = json.loads(result.stdout)["reasons"]
    assert reasons[0]["code"] == "bad-params" and "'blocks'" in reasons[0]["message"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_store_is_a_usage_error_as_user(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = autotune("loop", "rmsnorm", "--out", str(locked / "sub"))
    assert result.returncode == 2 and "not writable" in result.stderr


def test_unwritable_output_path_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for args in (
        ("loop", "rmsnorm", "--out", str(blocker / "sub")),
        (
            "loop",
            "rmsnorm",
            "--store",
            f"sqlite:///{blocker}/store.db",
            "--out",
            str(tmp_path / "o"),
        ),
        ("run", "--out", str(blocker / "sub")),
    ):
        result = autotune(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert "error:" in result.stderr


def test_tasks_lists_rmsnorm_as_json() -> None:
    result = autotune("tasks", "--json")
    rows = json.loads(result.stdout)
    rmsnorm = next(r for r in rows if r["task"] == "rmsnorm")
    assert "torch.compile" in rmsnorm["peers"]
    assert any("131072" in s for s in rmsnorm["shapes"]["cuda"])


def test_host_check_json_answers_without_a_gpu() -> None:
    result = autotune("host", "check", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data["gpu_present"], bool)
    assert all({"id", "status", "actual", "recommended"} <= set(c) for c in data["checks"])
    assert {c["status"] for c in data["checks"]} <= {"pass", "warn", "fail", "unknown"}


def test_baseline_to_file_then_compare_with_the_shipped_h200(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    result = autotune("baseline", "--quick", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"] == json.loads(out.read_text())["metrics"]
    cmp = autotune("baseline", "compare", str(out), "h200-kvm-passthrough", "--json")
    assert cmp.returncode == 0, cmp.stderr
    data = json.loads(cmp.stdout)
    assert "host memory bandwidth" in data["summary"]
    missing = autotune("baseline", "compare", str(tmp_path / "absent.json"), "h200-kvm-passthrough")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_bench_json_records_the_digest_of_the_file_it_timed() -> None:
    """Also: a peer named twice is timed once (the evaluator refuses repeated labels)."""
    import hashlib

    from loop.tasks import load_task

    task = load_task("rmsnorm")
    shape = task.shapes("cpu")[0].name
    result = autotune(
        "bench", "rmsnorm", "torch_rmsnorm.py", "--device", "cpu", "--shape", shape,
        "--peer", "eager", "--peer", "eager", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    digest = hashlib.sha256((task.folder / "torch_rmsnorm.py").read_bytes()).hexdigest()
    data = json.loads(result.stdout)
    assert data["candidate_sha256"] == digest
    assert [v["label"] for v in data["peer_verdicts"]] == ["eager"]

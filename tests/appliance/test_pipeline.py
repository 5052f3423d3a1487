"""The main job end to end on the CPU: every stage runs and the report validates; with --apply
on the simulated NVML device the profile is applied, restored, and the report holds the gains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from appliance.cli import main as cli
from appliance.report import validate_file
from host_tuning.apply import PersistentSimulatedNvml
from host_tuning.journal import read_journal
from host_tuning.nvml_base import DEVICE_FIELDS
from host_tuning.nvml_sim import SimulatedNvml

QUICK = ["--device", "cpu", "--quick", "--trials", "1", "--task", "rmsnorm"]


def autotune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=600
    )


def check_dry_run_report(out: Path, summary: dict) -> dict:
    assert summary["valid"] and summary["errors"] == []
    assert validate_file(out / "report.json") == []
    report = json.loads((out / "report.json").read_text())
    assert report["host"]["gpu_present"] is False or report["tasks"][0]["device"] == "cuda"
    task = report["tasks"][0]
    assert task["task"] == "rmsnorm" and task["trials"] == 1
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
    assert report["loop"]["proposals"]["tried"] == 1
    assert report["profile"]["mode"] == "dry-run" and "gains" not in report
    assert "rmsnorm" in (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert "<svg" in html and "rmsnorm" in html
    assert (out / "results.tsv").exists() and (out / "dispatch-rmsnorm.json").exists()
    assert (out / "run.log").exists() and (out / "experiments.sqlite3").exists()
    noise = report["noise"]
    assert noise["sample_unit"] == "block" and len(noise["samples"]) >= len(task["shapes"])
    assert 'class="plot drawn" id="plot-noise"' in html
    return report


def test_run_writes_a_valid_report_and_a_second_run_resumes_the_store(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = ["run", "--out", str(out), "--trials", "1", "--json"]
    first = autotune(*cmd)
    assert first.returncode == 0, first.stderr[-3000:]
    check_dry_run_report(out, json.loads(first.stdout))
    second = autotune(*cmd[:-1])  # as people read it: says that the study resumed, spent
    assert second.returncode == 0, second.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["loop"]["resumed"] is True
    said = " ".join(second.stderr.split())
    assert "resumed the study in" in said and "stopped (trials)" in said


def test_every_task_skips_those_without_a_single_process_candidate() -> None:
    """`--task all` runs the tasks the loop can run on this device and names the others;
    naming one of those is bad input."""
    from appliance.output import UsageFailure
    from appliance.pipeline import _tasks_with_candidates
    from loop.tasks import available_tasks, load_task

    tasks = [load_task(name) for name in available_tasks()]
    runnable, skipped = _tasks_with_candidates(tasks, "cpu", every=True)
    assert skipped == ["allreduce"]
    assert [t.name for t in runnable] == [n for n in available_tasks() if n != "allreduce"]
    with pytest.raises(UsageFailure, match="one process per GPU"):
        _tasks_with_candidates([load_task("allreduce")], "cpu", every=False)


def device_state(device) -> dict:
    return {
        "fields": {f: device.read(0, f).value for f in DEVICE_FIELDS},
        "locks": device.locked_clocks(0),
    }


def test_apply_on_the_simulated_device_measures_the_gains_and_restores(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = autotune(
        "run", "--out", str(out), *QUICK, "--apply", "--simulate", "h200", "--gain-rounds", "1"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    progress = result.stderr
    for stage in ("2/6 profile plan and pre-flight", "5/6 gains", "6/6 report"):
        assert stage in progress
    assert "round 1/1: tuned host" in progress and "round 1/1: restored" in progress
    assert validate_file(out / "report.json") == []
    report = json.loads((out / "report.json").read_text())

    profile = report["profile"]
    assert profile["mode"] == "applied" and profile["restored"] is True
    assert profile["nvml"] == "simulated: h200-passthrough-vm"
    assert {c["setting"] for c in profile["changes"] if c["status"] == "applied"} == {
        "gpu0.locked_clocks_mhz",
        "gpu0.memory_locked_clocks_mhz",
    }
    journal = read_journal(Path(profile["journal"]))
    assert journal.closed and not journal.pending
    state = PersistentSimulatedNvml("h200-passthrough-vm", out / "simulated-nvml-state.jsonl")
    assert state.state_path.read_text()  # the device was written to ...
    assert device_state(state) == device_state(SimulatedNvml.from_fixture("h200-passthrough-vm"))

    gains = report["gains"]
    e2e = gains["end_to_end"]
    for gain in (gains["hardware"], gains["kernel"], e2e["combined"]):
        assert 0 < gain["ci_low"] <= gain["ratio"] <= gain["ci_high"] and gain["n_blocks"] >= 1
    assert e2e["tuned"]["kernels"] == "dispatch table" and e2e["baseline"]["host"] == "stock"
    assert e2e["kernel_only"]["ratio"] == gains["kernel"]["ratio"]
    assert e2e["hardware_only"]["ratio"] == gains["hardware"]["ratio"]
    assert "rmsnorm (8 shapes)" in e2e["workload"] and e2e["rounds"] == 1
    suite = {m["name"] for m in report["baselines"]["metrics"]}
    assert {m["name"] for m in gains["hardware"]["metrics"]} == suite
    assert any("simulated" in n for n in gains["hardware"]["notes"])
    command = report["reproduce"]["command"]
    assert "--apply" in command and "--simulate h200" in command
    assert "## Gains" in (out / "report.md").read_text()


def test_simulate_needs_apply_and_a_known_fixture(tmp_path: Path) -> None:
    runner = CliRunner()
    lone = runner.invoke(cli, ["run", "--out", str(tmp_path / "a"), *QUICK, "--simulate", "h200"])
    assert lone.exit_code == 2 and "--simulate FIXTURE only makes sense with --apply" in lone.output
    unknown = runner.invoke(
        cli, ["run", "--out", str(tmp_path / "b"), *QUICK, "--apply", "--simulate", "x"]
    )
    assert unknown.exit_code == 2 and "unknown fixture 'x'" in unknown.output
    assert not (tmp_path / "b" / "report.json").exists()


@pytest.mark.gpu
def test_apply_on_the_gpu_host_goes_to_the_simulated_device_and_times_under_graphs(
    tmp_path: Path,
) -> None:
    """On the lent GPU: the kernels run on the GPU, the profile only on the simulated device."""
    out = tmp_path / "run"
    args = ["--device", "cuda", "--quick", "--trials", "1", "--task", "rmsnorm"]
    result = autotune("run", "--out", str(out), *args, "--apply", "--simulate", "h200", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["valid"] and summary["profile"]["restored"] is True
    assert summary["profile"]["nvml"] == "simulated: h200-passthrough-vm"
    report = json.loads((out / "report.json").read_text())
    e2e = report["gains"]["end_to_end"]
    assert e2e["method"] == "cuda-graph" and e2e["rounds"] == 2
    for gain in (report["gains"]["hardware"], report["gains"]["kernel"], e2e["combined"]):
        assert 0 < gain["ci_low"] <= gain["ratio"] <= gain["ci_high"]
    state = PersistentSimulatedNvml("h200-passthrough-vm", out / "simulated-nvml-state.jsonl")
    assert device_state(state) == device_state(SimulatedNvml.from_fixture("h200-passthrough-vm"))

"""Nsight Compute counters: the parser on real ncu output recorded on an H200, finding ncu, the
profiled driver process, and `profile_candidate` saying why when there are no counters."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from loop import profiler
from loop.profiler import (
    driver_command,
    driver_env,
    failure_reason,
    find_ncu,
    largest_shape,
    parse_ncu_csv,
    profile_candidate,
    profile_largest_shape,
)
from loop.tasks import load_task

FIXTURE = Path(__file__).parent / "fixtures" / "ncu-rmsnorm-h200.csv"
RMSNORM = load_task("rmsnorm")


@pytest.fixture()
def real_csv() -> str:
    return FIXTURE.read_text()


@pytest.fixture()
def no_ncu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A PATH without ncu, and install folders that hold none."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(profiler, "NCU_FALLBACKS", (str(tmp_path / "cuda" / "bin" / "ncu"),))
    return empty


def test_parses_the_key_counters_of_a_real_h200_run(real_csv: str) -> None:
    [k] = parse_ncu_csv(real_csv)
    assert k.name == "_rmsnorm_rows"
    assert (k.block_size, k.grid_size) == ((128, 1, 1), (32768, 1, 1))
    assert k.duration_ns == pytest.approx(224_736)
    assert k.dram_throughput_pct == pytest.approx(84.68)
    assert k.memory_throughput_pct == pytest.approx(84.68)
    assert k.memory_throughput_bytes_s == pytest.approx(4_073_906_877_402.82)
    assert k.compute_sm_throughput_pct == pytest.approx(44.04)
    assert k.l2_hit_rate_pct == pytest.approx(50.97)
    assert k.l1_hit_rate_pct == pytest.approx(33.20)
    assert k.achieved_occupancy_pct == pytest.approx(23.82)
    assert k.theoretical_occupancy_pct == pytest.approx(25)
    assert k.block_limit_registers == 4
    assert k.local_spill_requests == 0
    assert k.occupancy_limiter == "registers"
    # "no data" is None, thousands separators are gone, every metric is kept by section.
    assert k.metrics["Memory Workload Analysis/Local Memory Spilling Request Overhead"] is None
    assert k.metrics["GPU Speed Of Light Throughput/DRAM Frequency"] == pytest.approx(
        3_198_917_841.38
    )


def test_units_are_converted(real_csv: str) -> None:
    text = real_csv.replace('"Duration","ns","224,736"', '"Duration","usecond","224.736"')
    text = text.replace('"byte/s","4,073,906,877,402.82"', '"Gbyte/second","4,073.91"')
    [k] = parse_ncu_csv(text)
    assert k.duration_ns == pytest.approx(224_736)
    assert k.memory_throughput_bytes_s == pytest.approx(4.07391e12)


def test_several_kernels_and_stray_lines(real_csv: str) -> None:
    lines = real_csv.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    second = [line.replace('"0","1632"', '"1","1632"', 1) for line in lines[header + 1 :]]
    second = [line.replace("_rmsnorm_rows", "_other", 1) for line in second]
    text = "\n".join(
        ["program output before ncu's report", *lines, *second, "==WARNING== a late warning"]
    )
    kernels = parse_ncu_csv(text)
    assert [k.name for k in kernels] == ["_rmsnorm_rows", "_other"]
    assert kernels[1].dram_throughput_pct == pytest.approx(84.68)


def test_missing_counters_are_none(real_csv: str) -> None:
    kept = [line for line in real_csv.splitlines() if "L2 Hit Rate" not in line]
    text = "\n".join(kept).replace('"%","23.82"', '"%","no data"')
    [k] = parse_ncu_csv(text)
    assert k.l2_hit_rate_pct is None and k.achieved_occupancy_pct is None
    assert k.dram_throughput_pct == pytest.approx(84.68)


def test_malformed_output_is_a_clear_error(real_csv: str) -> None:
    with pytest.raises(ValueError, match="no header row"):
        parse_ncu_csv("==PROF== Connected to process 1\n==ERROR== LibraryNotLoaded\n")
    with pytest.raises(ValueError, match="no header row"):
        parse_ncu_csv("")
    without_value = real_csv.replace('"Metric Value",', '"Value",')
    with pytest.raises(ValueError, match="Metric Value"):
        parse_ncu_csv(without_value)


def test_failure_reason_is_one_line() -> None:
    out = "==PROF== Connected to process 7\n==ERROR== LibraryNotLoaded\n"
    assert failure_reason(1, out, "") == "ncu failed: ==ERROR== LibraryNotLoaded"
    reason = failure_reason(1, "", "Traceback (most recent call last):\nValueError: boom\n")
    assert reason == "ncu failed (exit 1): ValueError: boom"
    assert "exit 9" in failure_reason(9, "", "")


def test_find_ncu_on_path_then_install_folders(no_ncu: Path, monkeypatch, tmp_path: Path) -> None:
    assert find_ncu() is None
    installed = tmp_path / "opt" / "2025.1.0" / "ncu"
    installed.parent.mkdir(parents=True)
    installed.write_text("#!/bin/sh\n")
    installed.chmod(installed.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(profiler, "NCU_FALLBACKS", (str(tmp_path / "opt" / "*" / "ncu"),))
    assert find_ncu() == installed
    on_path = no_ncu / "ncu"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(on_path.stat().st_mode | stat.S_IXUSR)
    assert find_ncu() == on_path


def test_without_ncu_there_are_no_counters_and_a_reason(no_ncu: Path) -> None:
    shape = largest_shape(RMSNORM, "cuda")
    result = profile_candidate(
        RMSNORM.folder, RMSNORM.folder / "triton_rmsnorm.py", {}, shape, device="cuda"
    )
    assert not result.available and result.kernels == []
    assert result.shape == shape and "no ncu" in result.reason
    on_cpu = profile_candidate(
        RMSNORM.folder, RMSNORM.folder / "torch_rmsnorm.py", {}, shape, device="cpu"
    )
    assert not on_cpu.available and "not cuda" in on_cpu.reason


def test_the_largest_shape_is_profiled(no_ncu: Path) -> None:
    profiles = profile_largest_shape(RMSNORM, RMSNORM.folder / "torch_rmsnorm.py", {}, "cuda")
    assert list(profiles) == ["long-131072x7168"]
    assert not profiles["long-131072x7168"].available
    assert largest_shape(RMSNORM, "cuda", ["decode-1x4096", "prefill-512x4096"]) == (
        "prefill-512x4096"
    )


def test_the_driver_runs_the_candidate(tmp_path: Path) -> None:
    """The profiled process itself, on the CPU (where it only calls the kernel)."""
    shape = RMSNORM.shapes("cpu")[0].name
    candidate = tmp_path / "chatty.py"
    source = (RMSNORM.folder / "torch_rmsnorm.py").read_text()
    candidate.write_text(source + '\nprint("hello from the candidate")\n')
    params = {"method": "vector_norm"}
    env = driver_env()
    ok = subprocess.run(
        driver_command(RMSNORM.folder, candidate, params, shape, "cpu"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    # What the candidate prints goes to stderr, away from ncu's CSV on stdout.
    assert ok.stdout == "" and "hello from the candidate" in ok.stderr
    wrong = subprocess.run(
        driver_command(RMSNORM.folder, candidate, {}, "no-such-shape", "cpu"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrong.returncode != 0 and "no-such-shape" in wrong.stderr


@pytest.mark.gpu
def test_real_ncu_counts_the_triton_candidate() -> None:
    if find_ncu() is None:
        pytest.skip("no ncu on this host")
    shape = largest_shape(RMSNORM, "cuda")
    params = {"num_warps": 4, "rows_per_program": 1, "x_eviction": "", "chunk": 0}
    result = profile_candidate(
        RMSNORM.folder, RMSNORM.folder / "triton_rmsnorm.py", params, shape, timeout_s=300
    )
    host_limits = ("LibraryNotLoaded", "ERR_NVGPUCTRPERM")  # gVisor, no counter permission
    if not result.available and any(m in result.reason for m in host_limits):
        pytest.skip(f"ncu cannot profile on this host: {result.reason}")
    assert result.available, result.reason
    [k] = result.kernels  # warm-up calls are not counted, only the last call's one kernel
    assert "rmsnorm" in k.name
    assert k.duration_ns and k.duration_ns > 0
    assert k.dram_throughput_pct and 0 < k.dram_throughput_pct <= 100
    assert k.achieved_occupancy_pct is not None


def test_no_leftover_environment_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_SECRET_SEED", "1234")
    env = driver_env()
    assert "AUTOTUNE_SECRET_SEED" not in env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(profiler.HARNESS_ROOT)

"""The suite in several fresh processes: pooling, the two-level interval, a failed process."""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from appliance.cli import main
from baselines.environment import detect_environment
from baselines.stats import summarize
from baselines.suite import BaselineResult, Metric
from baselines.suite_processes import SuiteProcessError, pool_results, pooled_suite


def one_process(level: float, seed: int, with_gemm: bool = True) -> BaselineResult:
    """A process whose blocks scatter tightly around `level`: its own interval is narrow."""
    blocks = (level + np.random.default_rng(seed).normal(0, 0.001, 12)).tolist()
    s = summarize(blocks)
    metrics = [
        Metric("host_memory_bandwidth", "GB/s", s.median, s.ci_low, s.ci_high, s.n, True,
               blocks=tuple(blocks)),
    ]  # fmt: skip
    if with_gemm:
        metrics.append(Metric("cpu_fp32_gemm", "GFLOP/s", 50.0, 49.0, 51.0, 3, True,
                              blocks=(49.0, 50.0, 51.0)))  # fmt: skip
    return BaselineResult(
        device="cpu",
        device_name="test cpu",
        quick=True,
        metrics=metrics,
        environment=detect_environment(nvml=None),
        telemetry={"available": False, "reason": "CPU"},
        notes=["a note every process makes"],
    )


def test_pooled_interval_covers_what_differs_between_processes() -> None:
    runs = [one_process(level, seed) for seed, level in enumerate((100.0, 104.0, 102.0, 101.0))]
    pooled = pool_results(runs).metric("host_memory_bandwidth")
    # Each process alone claims a tight interval that the others fall outside of ...
    first = runs[0].metric("host_memory_bandwidth")
    assert first.ci_high < 101.0
    # ... pooled, the interval spans the processes, and every block is kept.
    assert pooled.ci_low <= 100.5 and pooled.ci_high >= 103.0
    assert pooled.processes == 4 and pooled.n == len(pooled.blocks) == 48
    assert pooled.value == pytest.approx(statistics.median(pooled.blocks))
    naive = summarize(list(pooled.blocks))  # pooling the blocks alone would stay narrow
    assert naive.ci_high - naive.ci_low < (pooled.ci_high - pooled.ci_low) / 2


def test_pooling_keeps_notes_once_and_says_what_some_processes_missed() -> None:
    runs = [one_process(100.0, 1), one_process(100.0, 2, with_gemm=False)]
    pooled = pool_results(runs)
    assert pooled.metric("cpu_fp32_gemm").processes == 1
    assert pooled.notes.count("a note every process makes") == 1
    assert "cpu_fp32_gemm: measured in 1 of 2 processes" in pooled.notes
    assert [t["reason"] for t in pooled.telemetry["processes"]] == ["CPU", "CPU"]
    # what is written reads back, blocks and process counts included
    again = BaselineResult.from_dict(json.loads(json.dumps(pooled.to_dict())))
    assert again.metric("host_memory_bandwidth") == pooled.metric("host_memory_bandwidth")


def test_a_metric_without_blocks_cannot_be_pooled() -> None:
    run = one_process(100.0, 1, with_gemm=False)
    old = BaselineResult.from_dict(
        {**run.to_dict(), "metrics": [{**run.metrics[0].to_dict(), "blocks": []}]}
    )
    with pytest.raises(ValueError, match=r"host_memory_bandwidth.*no blocks"):
        pool_results([run, old])


def test_bad_blocks_or_process_counts_are_named() -> None:
    doc = one_process(100.0, 1).to_dict()
    bad = {**doc["metrics"][0], "blocks": [1.0, -2.0]}
    with pytest.raises(ValueError, match=r"metrics\[0\]\.blocks"):
        BaselineResult.from_dict({**doc, "metrics": [bad]})
    bad = {**doc["metrics"][0], "processes": 0}
    with pytest.raises(ValueError, match=r"metrics\[0\]\.processes"):
        BaselineResult.from_dict({**doc, "metrics": [bad]})


def test_a_failed_process_is_named_with_its_log(monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(SuiteProcessError, match=r"baseline process 1 failed \(exit code 1\)"):
        pooled_suite("cpu", quick=True, processes=2)
    with pytest.raises(ValueError, match="device must be"):
        pooled_suite("tpu", quick=True, processes=2)


def test_the_cli_runs_the_suite_in_fresh_processes(tmp_path) -> None:
    out = tmp_path / "baseline.json"
    result = CliRunner().invoke(
        main, ["baseline", "--device", "cpu", "--quick", "--processes", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    doc = BaselineResult.from_dict(json.loads(out.read_text()))
    assert {m.name for m in doc.metrics} == {
        "host_memory_bandwidth",
        "cpu_fp32_gemm",
        "torch_op_overhead",
    }
    for metric in doc.metrics:
        assert metric.processes == 2 and metric.n == len(metric.blocks)
        assert metric.value == pytest.approx(statistics.median(metric.blocks))
        assert metric.ci_low <= metric.value <= metric.ci_high
    assert len(doc.telemetry["processes"]) == 2

"""The baseline suite: a real quick CPU run, its document, its table; the GPU run where there is one."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from baselines.environment import KINDS
from baselines.suite import (
    GEMM_N,
    SCHEMA,
    BaselineResult,
    Metric,
    default_device,
    render_result,
    run_suite,
)

CPU_UNITS = {
    "host_memory_bandwidth": "GB/s",
    "cpu_fp32_gemm": "GFLOP/s",
    "torch_op_overhead": "us",
}
GPU_UNITS = {
    "device_copy_bandwidth": "TB/s",
    "h2d_pinned_bandwidth": "GB/s",
    "d2h_pinned_bandwidth": "GB/s",
    "h2d_pageable_bandwidth": "GB/s",
    "d2h_pageable_bandwidth": "GB/s",
    "bf16_gemm": "TFLOP/s",
    "eager_launch_latency": "us",
    "graph_kernel_latency": "us",
    "host_memory_bandwidth": "GB/s",
}
LATENCIES = {"torch_op_overhead", "eager_launch_latency", "graph_kernel_latency"}


@pytest.fixture(scope="module")
def cpu_run() -> tuple[BaselineResult, list[str]]:
    messages: list[str] = []
    return run_suite("cpu", quick=True, progress=messages.append), messages


def check_metrics(result: BaselineResult, units: dict[str, str]) -> None:
    for m in result.metrics:
        assert m.unit == units[m.name], m.name
        assert m.value > 0, m.name
        assert 0 < m.ci_low <= m.value <= m.ci_high, m.name
        assert m.n >= 3, m.name  # several blocks (the timer may stop on time before 5)
        assert m.higher_is_better == (m.name not in LATENCIES), m.name


def test_cpu_suite_measures_every_cpu_metric(cpu_run) -> None:
    result, messages = cpu_run
    assert {m.name for m in result.metrics} == set(CPU_UNITS)
    check_metrics(result, CPU_UNITS)
    assert result.device == "cpu"
    assert result.quick
    assert result.environment.kind in KINDS
    assert result.telemetry["available"] is False
    assert len(messages) >= len(CPU_UNITS)


def test_document_round_trips_through_json(cpu_run) -> None:
    result, _ = cpu_run
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["schema"] == SCHEMA
    again = BaselineResult.from_dict(doc)
    assert again.metrics == result.metrics
    assert again.environment == result.environment
    assert again.to_dict() == doc


def test_table_has_a_row_per_metric(cpu_run) -> None:
    result, _ = cpu_run
    table = render_result(result)
    assert table.row_count == len(result.metrics)
    console = Console(width=160, record=True)
    console.print(render_result(result.to_dict()))
    text = console.export_text()
    for m in result.metrics:
        assert m.title in text


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "", "meta"])
def test_bad_device_is_a_clear_error(device: str) -> None:
    with pytest.raises(ValueError, match="device"):
        run_suite(device, quick=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_cuda_without_gpu_says_so() -> None:
    assert default_device() == "cpu"
    with pytest.raises(ValueError, match="no CUDA device"):
        run_suite("cuda", quick=True)


def metric_doc(**changes) -> dict:
    base = Metric("m", "GB/s", 2.0, 1.5, 2.5, 5, True, "m").to_dict()
    return {**base, **changes}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"value": -1.0}, r"metrics\[0\]\.value"),
        ({"ci_low": 3.0}, r"metrics\[0\]: ci_low <= value"),
        ({"ci_high": "high"}, r"metrics\[0\]\.ci_high"),
        ({"n": 0}, r"metrics\[0\]\.n"),
        ({"unit": ""}, r"metrics\[0\]\.unit"),
        ({"higher_is_better": "yes"}, r"metrics\[0\]\.higher_is_better"),
    ],
)
def test_bad_documents_name_the_field(cpu_run, changes: dict, field: str) -> None:
    doc = cpu_run[0].to_dict()
    doc["metrics"] = [metric_doc(**changes)]
    with pytest.raises(ValueError, match=field):
        BaselineResult.from_dict(doc)


def test_bad_document_shapes(cpu_run) -> None:
    doc = cpu_run[0].to_dict()
    with pytest.raises(ValueError, match="schema"):
        BaselineResult.from_dict({**doc, "schema": "other/1"})
    with pytest.raises(ValueError, match="metrics must be a list"):
        BaselineResult.from_dict({**doc, "metrics": None})
    with pytest.raises(ValueError, match="more than once"):
        BaselineResult.from_dict({**doc, "metrics": [metric_doc(), metric_doc()]})
    with pytest.raises(ValueError, match=r"baseline\.environment"):
        BaselineResult.from_dict({k: v for k, v in doc.items() if k != "environment"})


@pytest.mark.gpu
def test_gpu_suite() -> None:
    result = run_suite("cuda", quick=True)
    names = {m.name for m in result.metrics}
    assert set(GPU_UNITS) <= names
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= (8, 9):
        assert "fp8_gemm" in names
    else:
        assert "fp8_gemm" not in names
        assert any("fp8" in note for note in result.notes)
    check_metrics(result, {**GPU_UNITS, "fp8_gemm": "TFLOP/s"})
    assert result.metric("bf16_gemm").title == f"bf16 GEMM {GEMM_N}^3"
    telemetry = result.telemetry
    if telemetry["available"]:
        assert telemetry["overall"]["blocks"] > 0
        assert telemetry["metrics"]["device_copy_bandwidth"]["sm_clock_median_mhz"] > 0
        assert telemetry["metrics"]["bf16_gemm"]["power_bound"] is True
        assert telemetry["metrics"]["device_copy_bandwidth"]["power_bound"] is False

"""Telemetry over a run, read from the simulated H200 (NVML is only read)."""

from __future__ import annotations

import time

import pytest
from jsonschema import Draft202012Validator

from appliance.report.schema import load_schema
from baselines.run_telemetry import RunTelemetry
from host_tuning.nvml_sim import SimulatedNvml


@pytest.fixture
def h200() -> SimulatedNvml:
    return SimulatedNvml.from_fixture("h200-passthrough-vm")


def test_samples_are_tagged_with_the_stage_and_fit_the_report_schema(h200) -> None:
    telemetry = RunTelemetry(h200, 0, period_s=0.01)
    telemetry.label = "baselines"  # the read on entering has it, however late the thread runs
    with telemetry:
        time.sleep(0.05)
        telemetry.label = "loop"
        time.sleep(0.05)
    series = telemetry.to_dict()
    labels = {s.get("label") for s in series["samples"]}
    assert {"baselines", "loop"} <= labels
    times = [s["t_s"] for s in series["samples"]]
    assert times == sorted(times) and times[0] >= 0
    assert all(
        s["sm_clock_mhz"] == h200.read(0, "clock_sm_current_mhz").value for s in series["samples"]
    )
    schema = load_schema("2")
    validator = Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/telemetry_series"})
    assert list(validator.iter_errors(series)) == []


def test_a_long_run_keeps_its_whole_span_at_a_coarser_grain(h200) -> None:
    with RunTelemetry(h200, 0, period_s=0.001, max_samples=10) as telemetry:
        deadline = time.monotonic() + 30  # enough reads to thin, however loaded the machine
        while telemetry.sample_count < 12 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.1)
    series = telemetry.to_dict()
    assert len(series["samples"]) <= 11
    assert series["period_s"] > 0.001
    assert series["samples"][-1]["t_s"] >= 0.09


def test_a_bad_gpu_index_or_period_is_refused(h200) -> None:
    with pytest.raises(ValueError):
        RunTelemetry(h200, 0, period_s=0)
    with pytest.raises(Exception, match="7"):
        RunTelemetry(h200, 7)

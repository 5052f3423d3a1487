"""The fleet report: host checks from the simulated H200 (recorded facts), with variants, and
baselines; outliers are flagged and healthy hosts are not."""

from __future__ import annotations

from appliance.fleet.report import HostInput, fleet_report, render_markdown, render_table
from host_tuning.nvml_base import CLOCK_EVENT_REASONS
from host_tuning.nvml_sim import SimulatedNvml
from host_tuning.report import host_report

THERMAL_BIT = next(
    bit for bit, name in CLOCK_EVENT_REASONS.items() if name == "hw_thermal_slowdown"
)


def check_of(**overrides) -> dict:
    return host_report(SimulatedNvml.from_fixture("h200-passthrough-vm", overrides=overrides))


def baseline(bandwidth: float, gemm: float = 100.0) -> dict:
    return {
        "metrics": [
            {"name": "h2d_pinned_bandwidth", "unit": "GB/s", "value": bandwidth},
            {"name": "fp16_gemm", "unit": "TFLOP/s", "value": gemm, "higher_is_better": True},
        ]
    }


def rows_by_name(hosts: list[HostInput]) -> dict:
    return {r.name: r for r in fleet_report(hosts).rows}


def test_healthy_fleet_has_no_outliers():
    hosts = [
        HostInput(n, check=check_of(), baseline=baseline(50.0 + i)) for i, n in enumerate("abc")
    ]
    report = fleet_report(hosts)
    assert report.outliers == []
    row = report.rows[0]
    assert row.gpu == "1x NVIDIA H200"
    assert row.driver == "580.159.04"
    assert row.link == "Gen5 x16"
    assert row.clocks == "SM 345/1980 MHz, mem 3201/3201 MHz"
    assert report.medians == {"h2d_pinned_bandwidth": 51.0}


def test_link_below_its_maximum_is_flagged():
    rows = rows_by_name(
        [
            HostInput("full", check=check_of()),
            HostInput("gen4", check=check_of(pcie_link_gen_current=4)),
            HostInput("x8", check=check_of(pcie_link_width_current=8)),
        ]
    )
    assert rows["full"].flags == []
    assert any("link below its maximum: Gen4 of Gen5" in f for f in rows["gen4"].flags)
    assert rows["gen4"].link == "Gen4 x16 (max Gen5 x16)"
    assert any("x8 of x16" in f for f in rows["x8"].flags)


def test_bandwidth_under_90_percent_of_median_is_flagged():
    rows = rows_by_name(
        [
            HostInput("a", baseline=baseline(50.0, gemm=10.0)),
            HostInput("b", baseline=baseline(48.0)),
            HostInput("slow", baseline=baseline(40.0)),
        ]
    )
    assert rows["a"].flags == [] and rows["b"].flags == []  # GEMM is not a bandwidth
    (flag,) = rows["slow"].flags
    assert "h2d_pinned_bandwidth 40 GB/s is under 90 % of the fleet median 48" in flag


def test_throttling_and_failed_checks_are_flagged():
    rows = rows_by_name([HostInput("hot", check=check_of(clock_event_reasons_current=THERMAL_BIT))])
    flags = rows["hot"].flags
    assert rows["hot"].failed_checks == ["gpu.clock_events"]
    assert any(f.startswith("failed checks: gpu.clock_events") for f in flags)
    assert any(f.startswith("throttling: gpu0") and "hw_thermal_slowdown" in f for f in flags)


def test_hosts_that_did_not_answer_are_flagged_and_rendered():
    report = fleet_report(
        [
            HostInput("ok", check=check_of()),
            HostInput("down", status="unreachable", reason="127.0.0.9:22 refused the connection"),
        ]
    )
    assert report.outliers == ["down"]
    assert report.rows[1].flags == ["unreachable: 127.0.0.9:22 refused the connection"]
    markdown = render_markdown(report)
    assert "| down | unreachable |" in markdown and "Outliers: down" in markdown
    assert render_table(report).row_count == 2
    assert report.to_dict()["hosts"][1]["status"] == "unreachable"

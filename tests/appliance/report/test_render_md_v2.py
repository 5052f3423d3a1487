"""Markdown of the version 2 blocks: profile applied and restored, A/A samples, the end-to-end
block, telemetry, the virtualized-versus-bare comparison, honesty figures, reproduce."""

from __future__ import annotations

import pytest

from appliance.report import render_markdown
from tests.appliance.report.sample_v2 import sample_v2
from tests.appliance.report.test_render_md import _rows_by_first_cell, _section, _tables


@pytest.fixture
def doc() -> dict:
    return sample_v2()


@pytest.fixture
def md(doc: dict) -> str:
    return render_markdown(doc)


def test_every_table_is_rectangular(md: str) -> None:
    tables = _tables(md)
    assert len(tables) >= 14
    for table in tables:
        assert {len(row) for row in table} == {len(table[0])}, table


def test_profile_applied_restored_and_read_back(doc: dict, md: str) -> None:
    section = _section(md, "Profile")
    assert "applied. Applied at 2026-11-29T14:03:20Z. Restored afterwards." in section
    assert "Restored at 2026-11-29T14:10:12Z" in section
    assert "`/run/autotune/host-journal.jsonl`" in section
    rows = _rows_by_first_cell(_tables(section)[0])
    assert rows["gpu.locked_clocks_mhz"]["read back"] == "[1980, 1980]"
    assert rows["gpu.locked_clocks_mhz"]["status"] == "restored"
    doc["profile"]["restored"] = False
    doc["profile"]["restore_errors"] = ["gpu.locked_clocks_mhz: NVML said no"]
    broken = _section(render_markdown(doc), "Profile")
    assert "NOT fully restored" in broken and "- gpu.locked_clocks_mhz: NVML said no" in broken


def test_noise_samples_and_the_comparison_of_environments(doc: dict, md: str) -> None:
    noise = _rows_by_first_cell(_tables(_section(md, "Noise floor"))[0])
    samples = doc["noise"]["samples"]
    (row,) = [r for k, r in noise.items() if k.startswith("A/A samples (200")]
    assert f"min {min(samples):.4f}" in row["value"] and f"max {max(samples):.4f}" in row["value"]
    versus = _section(md, "bare metal versus passthrough VM")
    assert "bare metal is bare-metal, passthrough VM is vm-passthrough." in versus
    rows = _rows_by_first_cell(_tables(versus)[0])
    assert rows["launch latency"]["bare metal better by [interval]"] == "1.180x [1.150, 1.210]"
    assert rows["launch latency"]["passthrough VM"] == "2.48 us"


def test_end_to_end_block_sits_next_to_kernel_and_hardware_gains(md: str) -> None:
    gains = _rows_by_first_cell(_tables(_section(md, "Gains"))[0])
    assert gains["end-to-end"]["ratio [interval]"] == "2.020x [2.000, 2.040]"
    assert gains["hardware"]["ratio [interval]"] == "1.031x [1.024, 1.038]"
    e2e = _section(md, "End to end: rmsnorm over the shape set, weighted")
    assert "dispatch table on h200-sxm-locked against torch.compile on stock" in e2e
    assert "not a product" in e2e
    ratios, times = _tables(e2e)
    rows = _rows_by_first_cell(ratios)
    assert rows["combined (end to end)"]["ratio [interval]"] == "2.020x [2.000, 2.040]"
    assert rows["kernel only"]["blocks"] == "20"
    assert rows["hardware only"]["ratio [interval]"] == "1.031x [1.024, 1.038]"
    assert _rows_by_first_cell(times)["torch.compile on stock"]["time [interval]"].startswith(
        "505 µs"
    )


def test_task_ceilings_claims_and_telemetry(doc: dict, md: str) -> None:
    task = _section(md, "Task `rmsnorm` (cuda, bfloat16)")
    assert "40 trials, 6 accepted, 3 kept." in task
    assert "Ceilings: 4.27 TB/s, 989 TFLOP/s (measured d2d copy)." in task
    shapes = _rows_by_first_cell(_tables(_section(md, "Per shape"))[0])
    claim = doc["tasks"][0]["shapes"][2]["incumbent_speedup_vs_best_peer"]
    assert shapes["32768x7168"]["incumbent vs best peer [interval]"] == (
        f"{claim['ratio']:.3f}x [{claim['ci_low']:.3f}, {claim['ci_high']:.3f}]"
    )
    assert shapes["decode-1x4096"]["incumbent vs best peer [interval]"] == "—"
    telemetry = _rows_by_first_cell(_tables(_section(md, "Telemetry while measuring"))[0])
    assert telemetry["32768x7168"]["SM clock MHz"] == "1980 [1965, 1980]"
    assert telemetry["32768x7168"]["re-measured blocks"] == "1"
    run = _section(md, "GPU telemetry over the run")
    assert "40 samples over 390 s. Clock event reasons seen: sw_power_cap." in run
    rows = _rows_by_first_cell(_tables(run)[0])
    assert (rows["SM clock MHz"]["min"], rows["SM clock MHz"]["max"]) == ("1755", "1980")


def test_honesty_figures_and_reproduce(doc: dict, md: str) -> None:
    rows = _rows_by_first_cell(_tables(_section(md, "Proposals (honesty figures)"))[0])
    p = doc["loop"]["proposals"]
    assert rows["tried"]["count"] == str(p["tried"])
    assert rows["kept (faster than the incumbent)"]["count"] == "3"
    assert rows["rejected"]["count"] == str(p["rejected"])
    for code, n in p["rejected_by_reason"].items():
        assert rows[f"rejected: {code}"]["count"] == str(n)
    reproduce = _section(md, "Reproduce")
    assert f"```sh\n{doc['reproduce']['command']}\n```" in reproduce
    assert "```sh\nautotune report verify out/h200/report.json\n```" in reproduce
    assert "| CUDA_VISIBLE_DEVICES | 0 |" in reproduce


def test_a_v1_report_says_it_was_read_as_v2() -> None:
    from tests.appliance.sample_report import sample_report

    md = render_markdown(sample_report())
    assert "Report schema v1, read as v2." in md.splitlines()[2]

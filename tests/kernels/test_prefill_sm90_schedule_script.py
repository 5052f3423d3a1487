"""scripts/prefill_sm90_schedule.py: the prefill kernel's sm_90 builds and whether its softmax
overlaps its products, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    return import_file(ROOT / "scripts" / "prefill_sm90_schedule.py")


def test_only_exponentials_while_a_group_is_in_flight_count(script) -> None:
    ptx = "\n".join(
        [
            "ex2.approx.f32 %f1, %f2;",  # nothing in flight yet
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 ...;",
            "wgmma.commit_group.sync.aligned;",
            "\tex2.approx.f32 %f3, %f4;",  # overlaps the group above
            "wgmma.commit_group.sync.aligned;",
            "wgmma.wait_group.sync.aligned 1;",  # one group still in flight
            "ex2.approx.f32 %f5, %f6;",
            "wgmma.wait_group.sync.aligned 0;",
            "ex2.approx.f32 %f7, %f8;",  # after the last wait
        ]
    )
    assert script.ex2_in_flight(ptx) == (2, 4)


def test_a_build_reports_its_resources_and_its_exponentials(script) -> None:
    pytest.importorskip("triton")
    row = script.schedule({"block_n": 64, "num_stages": 2, "max_registers": 128})
    assert row["params"]["loads"] == "descriptor" and row["params"]["block_m"] == 128
    assert 0 < row["registers"] <= 128
    assert row["spill_bytes"] >= 0 and row["shared_bytes"] > 0
    assert 0 <= row["ex2_in_flight"] <= row["ex2"] and row["ex2"] > 0


def test_an_unknown_parameter_is_refused_by_name(script) -> None:
    pytest.importorskip("triton")
    with pytest.raises(ValueError, match="block_h"):
        script.schedule({"block_h": 16})

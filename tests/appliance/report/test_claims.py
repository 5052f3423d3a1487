"""Claims and their judgement, on crafted inputs: no measurement happens here."""

from __future__ import annotations

import pytest

from appliance.report.claims import (
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Measured,
    claims_of,
    environment_differences,
    judge,
)
from appliance.report.document import upgrade
from tests.appliance.report.sample_v2 import sample_v2
from tests.appliance.sample_report import sample_report, timing


def _claim(ratio: float = 2.0, lo: float = 1.98, hi: float = 2.02) -> Claim:
    return Claim(
        "rmsnorm",
        "32768x7168",
        "cuda",
        "triton_rmsnorm",
        {},
        "torch.compile",
        ratio,
        lo,
        hi,
        "measured-ratio",
    )


@pytest.mark.parametrize(
    ("measured", "tolerance", "status"),
    [
        (Measured(2.0, 1.99, 2.01), 0.0, REPRODUCED),  # inside
        (Measured(2.05, 2.015, 2.09), 0.0, REPRODUCED),  # overlaps the top end
        (Measured(2.10, 2.03, 2.15), 0.0, NOT_REPRODUCED),  # just above, no overlap
        (Measured(2.10, 2.03, 2.15), 0.01, REPRODUCED),  # within 1 % of the top end
        (Measured(1.50, 1.45, 1.55), 0.05, NOT_REPRODUCED),  # far below
        (Measured(1.0, 0.99, 1.01), 0.0, NOT_REPRODUCED),
    ],
)
def test_judge_compares_intervals_with_a_tolerance(
    measured: Measured, tolerance: float, status: str
) -> None:
    result = judge(_claim(), measured, [], tolerance)
    assert result.status == status
    assert "claimed 2.000x [1.980, 2.020]" in result.why
    assert f"measured {measured.ratio:.3f}x" in result.why
    assert result.to_dict()["measured"]["ratio"] == measured.ratio


def test_judge_says_which_environment_difference_makes_a_claim_incomparable() -> None:
    result = judge(
        _claim(), Measured(2.0, 1.99, 2.01), ["GPU: report NVIDIA H200, here NVIDIA A100"]
    )
    assert result.status == NOT_COMPARABLE
    assert result.why == "GPU: report NVIDIA H200, here NVIDIA A100"


def test_judge_without_a_measurement_says_why() -> None:
    result = judge(_claim(), None, [], failure="the candidate is rejected here: wrong-result: x")
    assert result.status == NOT_REPRODUCED
    assert "wrong-result" in result.why and "claimed 2.000x" in result.why


def _fp(gpu: str | None, driver: str | None, cpu: str = "Xeon") -> dict:
    gpus = [{"name": gpu}] if gpu else []
    return {"gpus": gpus, "versions": {"driver": driver}, "host": {"cpu_model": cpu}}


@pytest.mark.parametrize(
    ("here", "device", "expected"),
    [
        (_fp("NVIDIA H200", "580.1"), "cuda", []),
        (_fp("NVIDIA A100", "580.1"), "cuda", ["GPU: report NVIDIA H200, here NVIDIA A100"]),
        (_fp("NVIDIA H200", "575.2"), "cuda", ["driver: report 580.1, here 575.2"]),
        (_fp(None, None), "cuda", ["no GPU on this host (the report ran on NVIDIA H200)"]),
        (_fp(None, None), "cpu", []),
        (_fp(None, None, cpu="EPYC"), "cpu", ["CPU: report Xeon, here EPYC"]),
    ],
)
def test_environment_differences(here: dict, device: str, expected: list[str]) -> None:
    assert environment_differences(_fp("NVIDIA H200", "580.1"), here, device) == expected


def test_a_gpu_claim_from_a_report_that_names_no_gpu_is_not_comparable() -> None:
    here = _fp("NVIDIA H200", "580.1")
    assert environment_differences(_fp(None, "580.1"), here, "cuda") == [
        "the report names no GPU for its GPU claims"
    ]


def test_claims_of_a_v2_report_use_the_incumbent_spec_and_its_measured_ratio() -> None:
    doc = sample_v2()
    claims, notes = claims_of(doc)
    shapes = doc["tasks"][0]["shapes"]
    assert [c.shape for c in claims] == [s["name"] for s in shapes[1:]]
    assert notes == ["rmsnorm decode-1x4096: no candidate time was measured"]
    big = next(c for c in claims if c.shape == "32768x7168")
    spec = shapes[2]["incumbent_spec"]
    assert (big.candidate, big.params, big.sha256) == (
        spec["candidate"],
        spec["params"],
        spec["sha256"],
    )
    assert big.peer == "torch.compile"
    assert big.ratio == shapes[2]["incumbent_speedup_vs_best_peer"]["ratio"]
    assert big.basis == "measured-ratio"


def test_a_shape_won_by_a_peer_borrows_the_task_candidate_and_derives_the_ratio_from_times() -> (
    None
):
    doc = upgrade(sample_report())
    decode = doc["tasks"][0]["shapes"][0]
    decode["incumbent"] = timing(3.0)
    claims, notes = claims_of(doc)
    claim = next(c for c in claims if c.shape == "decode-1x4096")
    assert notes == []
    assert claim.basis == "time-intervals"
    assert (claim.candidate, claim.params) == ("triton_rmsnorm", {"BLOCK": 4096, "num_warps": 8})
    assert claim.peer == "torch.compile"
    peer = decode["peers"]["torch.compile"]
    assert claim.ratio == pytest.approx(2.6 / 3.0)
    assert claim.ci_low == pytest.approx(peer["ci_low_s"] / decode["incumbent"]["ci_high_s"])
    assert claim.ci_low < claim.ratio < claim.ci_high


def test_shapes_without_a_named_candidate_make_notes_not_claims() -> None:
    doc = upgrade(sample_report())
    task = doc["tasks"][0]
    task["dispatch"] = [e for e in task["dispatch"] if e["source"] == "peer"]
    for shape in task["shapes"]:
        shape["winner"] = None
    claims, notes = claims_of(doc)
    assert claims == []
    assert len(notes) == len(task["shapes"])
    assert all("does not name the candidate" in n for n in notes)

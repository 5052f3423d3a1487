"""Comparing two baselines: direction-aware ratios, propagated intervals, summary lines, the
shipped H200 reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from baselines.compare import (
    compare_baselines,
    ratio_from_intervals,
    read_baseline,
    reference_names,
    render_comparison,
)
from baselines.environment import Environment
from baselines.suite import SPECS, BaselineResult, Metric

REFERENCE = "h200-kvm-passthrough"


def env(kind: str) -> Environment:
    return Environment(kind=kind, evidence=[f"{kind} evidence"], hypervisor_vendor=None)


def metric(name: str, value: float, low: float, high: float, n: int = 9) -> Metric:
    spec = SPECS[name]
    return Metric(name, spec.unit, value, low, high, n, spec.higher_is_better, spec.title)


def doc(kind: str, *metrics: Metric) -> dict:
    result = BaselineResult("cuda:0", "GPU", False, list(metrics), env(kind), {"available": False})
    return result.to_dict()


def test_rate_ratio_with_one_exact_side_is_the_other_sides_interval() -> None:
    a = metric("device_copy_bandwidth", 4.0, 4.0, 4.0, n=1)
    b = metric("device_copy_bandwidth", 2.0, 1.6, 2.5)
    ratio, low, high = ratio_from_intervals(a, b)
    assert ratio == pytest.approx(2.0)
    assert low == pytest.approx(4.0 / 2.5)  # A at its value, B at its best
    assert high == pytest.approx(4.0 / 1.6)


def test_latency_ratio_points_the_other_way() -> None:
    a = metric("eager_launch_latency", 5.0, 5.0, 5.0, n=1)
    b = metric("eager_launch_latency", 6.0, 5.0, 7.5)
    ratio, low, high = ratio_from_intervals(a, b)
    assert ratio == pytest.approx(6.0 / 5.0)  # A's lower latency makes A better
    assert low == pytest.approx(5.0 / 5.0)
    assert high == pytest.approx(7.5 / 5.0)


def test_intervals_add_in_quadrature_on_the_log_scale() -> None:
    a = metric("bf16_gemm", 700.0, 690.0, 710.0)
    b = metric("bf16_gemm", 600.0, 594.0, 606.0)
    exact_a = metric("bf16_gemm", 700.0, 700.0, 700.0, n=1)
    exact_b = metric("bf16_gemm", 600.0, 600.0, 600.0, n=1)
    _, low, high = ratio_from_intervals(a, b)
    _, low_a, high_a = ratio_from_intervals(a, exact_b)
    _, low_b, high_b = ratio_from_intervals(exact_a, b)
    r = 700.0 / 600.0
    wider = math.log(r / low), math.log(r / low_a), math.log(r / low_b)
    assert wider[0] == pytest.approx(math.hypot(wider[1], wider[2]))
    up = math.log(high / r), math.log(high_a / r), math.log(high_b / r)
    assert up[0] == pytest.approx(math.hypot(up[1], up[2]))


def test_swapping_sides_inverts_everything() -> None:
    a = doc("bare-metal", metric("bf16_gemm", 700.0, 690.0, 712.0))
    b = doc("vm-passthrough", metric("bf16_gemm", 650.0, 640.0, 655.0))
    ab = compare_baselines(a, b).metrics[0]
    ba = compare_baselines(b, a).metrics[0]
    assert ab.ratio == pytest.approx(1 / ba.ratio)
    assert ab.ci_low == pytest.approx(1 / ba.ci_high)
    assert ab.ci_high == pytest.approx(1 / ba.ci_low)
    assert (ab.verdict, ba.verdict) == ("A better", "B better")


def test_summary_line_names_the_better_environment() -> None:
    bare = doc(
        "bare-metal",
        metric("eager_launch_latency", 5.00, 4.98, 5.02),
        metric("device_copy_bandwidth", 4.27, 4.26, 4.28),
    )
    vm = doc(
        "vm-passthrough",
        metric("eager_launch_latency", 5.90, 5.88, 5.93),
        metric("device_copy_bandwidth", 4.27, 4.26, 4.28),
    )
    cmp = compare_baselines(bare, vm)
    assert (cmp.label_a, cmp.label_b) == ("bare metal", "VM (GPU passthrough)")
    assert cmp.summary.startswith("bare metal 1.18x [")
    assert cmp.summary.endswith("] on launch latency")
    verdicts = {m.name: m.verdict for m in cmp.metrics}
    assert verdicts == {"eager_launch_latency": "A better", "device_copy_bandwidth": "same"}
    # the same comparison the other way round still names bare metal
    assert compare_baselines(vm, bare).summary.startswith("bare metal 1.18x [")


def test_no_difference_and_labels() -> None:
    one = doc("vm", metric("host_memory_bandwidth", 12.0, 11.99, 12.01))
    cmp = compare_baselines(one, one)
    assert cmp.metrics[0].ratio == pytest.approx(1.0)
    assert cmp.metrics[0].verdict == "same"
    assert "no difference beyond the intervals" in cmp.summary
    assert (cmp.label_a, cmp.label_b) == ("A (VM)", "B (VM)")
    named = compare_baselines(one, one, labels=("monday", "tuesday"))
    assert named.label_a == "monday"


def test_wide_intervals_are_ambiguous() -> None:
    a = doc("bare-metal", metric("torch_op_overhead", 2.0, 1.5, 3.0))
    b = doc("vm", metric("torch_op_overhead", 2.2, 1.6, 3.1))
    assert compare_baselines(a, b).metrics[0].verdict == "ambiguous"


def test_unshared_and_mismatched_metrics_are_noted() -> None:
    a = doc("bare-metal", metric("bf16_gemm", 700, 690, 710), metric("fp8_gemm", 1200, 1190, 1210))
    b_metric = metric("bf16_gemm", 650, 640, 660)
    b = doc("vm", b_metric, metric("host_memory_bandwidth", 50, 49, 51))
    cmp = compare_baselines(a, b)
    assert [m.name for m in cmp.metrics] == ["bf16_gemm"]
    assert any("only in A" in n and "fp8" in n for n in cmp.notes)
    assert any("only in B" in n and "host memory" in n for n in cmp.notes)
    b_other = doc("vm", Metric("bf16_gemm", "GFLOP/s", 1.0, 0.9, 1.1, 5, True, "x"))
    assert compare_baselines(a, b_other).metrics == []


def test_bad_documents_name_the_side_and_field() -> None:
    good = doc("vm", metric("bf16_gemm", 700, 690, 710))
    bad = json.loads(json.dumps(good))
    bad["metrics"][0]["ci_high"] = -3
    with pytest.raises(ValueError, match=r"^B\.metrics\[0\]\.ci_high"):
        compare_baselines(good, bad)
    with pytest.raises(ValueError, match=r"^A must be a JSON object"):
        compare_baselines([], good)
    with pytest.raises(ValueError, match="min_effect"):
        compare_baselines(good, good, min_effect=-0.1)


def test_reference_file_is_a_valid_baseline_in_suite_format() -> None:
    assert REFERENCE in reference_names()
    ref = read_baseline(REFERENCE)
    assert ref["source"] == "suite" and ref["device_name"] == "NVIDIA H200"
    result = BaselineResult.from_dict(ref)
    assert result.environment.kind == "vm-passthrough"
    assert result.environment.hypervisor_vendor == "KVM"
    for m in result.metrics:
        spec = SPECS[m.name]
        assert (m.unit, m.higher_is_better, m.title) == (
            spec.unit,
            spec.higher_is_better,
            spec.title,
        )


def test_reference_against_a_faster_host() -> None:
    ref = read_baseline(REFERENCE)
    copy = BaselineResult.from_dict(ref).metric("device_copy_bandwidth")
    faster = doc(
        "bare-metal",
        metric("device_copy_bandwidth", copy.value * 1.05, copy.value * 1.04, copy.value * 1.06),
    )
    cmp = compare_baselines(faster, ref)
    assert cmp.summary.startswith("bare metal 1.05")
    console = Console(width=200, record=True)
    console.print(render_comparison(cmp))
    text = console.export_text()
    assert "device copy bandwidth" in text and "A better" in text
    assert render_comparison(cmp).row_count == 1


def test_read_baseline_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        read_baseline(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        read_baseline(broken)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "autotune.baseline/1", "metrics": [{}]}))
    with pytest.raises(ValueError, match=r"wrong\.json\.metrics\[0\]\.name"):
        read_baseline(wrong)

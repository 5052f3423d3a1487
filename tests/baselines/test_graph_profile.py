"""The graph timeline: replays cut apart in time order, medians per position, gaps counted."""

from __future__ import annotations

import pytest
import torch

from baselines.graph_profile import (
    KernelSpan,
    format_timeline,
    kernel_timeline,
    summarize_replays,
)


def _replay(t0: float, kernels: list[tuple[str, float, float]]) -> list[KernelSpan]:
    """Kernels as (name, gap before, duration) from t0."""
    spans, t = [], t0
    for name, gap, duration in kernels:
        spans.append(KernelSpan(name, t + gap, t + gap + duration))
        t += gap + duration
    return spans


def test_replays_are_cut_in_time_order_and_medians_taken() -> None:
    runs = [
        _replay(0.0, [("norm", 0, 2.0), ("gemv", 1.0, 10.0), ("add", 0.5, 1.0)]),
        _replay(100.0, [("norm", 0, 2.2), ("gemv", 3.0, 12.0), ("add", 0.5, 1.0)]),
        _replay(200.0, [("norm", 0, 2.1), ("gemv", 2.0, 11.0), ("add", 1.5, 1.0)]),
    ]
    spans = [s for run in reversed(runs) for s in run]  # the profiler's order is not time's
    t = summarize_replays(spans, 3)
    assert [s.name for s in t.steps] == ["norm", "gemv", "add"]
    assert [s.duration_us for s in t.steps] == pytest.approx([2.1, 11.0, 1.0])
    assert [s.gap_before_us for s in t.steps] == pytest.approx([0.0, 2.0, 0.5])
    # norm's start to gemv's: 3.0, 5.2, 4.1; gemv's to add's: 10.5, 15.5, 12.5; add's duration
    assert [s.advance_us for s in t.steps] == pytest.approx([4.1, 12.5, 1.0])
    assert t.span_us == pytest.approx(17.6)  # the runs span 14.5, 18.7 and 17.6
    assert t.busy_us == pytest.approx(14.1)  # and run kernels for 13.0, 15.2 and 14.1
    assert t.gaps_us == pytest.approx(3.5)
    table = format_timeline(t)
    assert "gemv" in table and "gaps 3.50" in table
    assert table.splitlines()[2].split()[:4] == ["1", "11.00", "2.00", "12.50"]


def test_overlapping_kernels_advance_by_less_than_they_last() -> None:
    """Launched with programmatic dependent launch, a kernel starts while the one before drains
    (a negative gap) and its duration counts its wait: the advances still add up to the span."""
    runs = [
        _replay(0.0, [("rope", 0, 15.0), ("split", -1.5, 11.0), ("merge", -9.0, 13.0)]),
        _replay(100.0, [("rope", 0, 15.0), ("split", -1.5, 11.0), ("merge", -9.0, 13.0)]),
    ]
    t = summarize_replays([s for run in runs for s in run], 2)
    assert [s.advance_us for s in t.steps] == pytest.approx([13.5, 2.0, 13.0])
    assert sum(s.advance_us for s in t.steps) == pytest.approx(t.span_us)
    assert t.gaps_us == pytest.approx(-10.5)


def test_uneven_or_differing_replays_are_refused() -> None:
    one = _replay(0.0, [("a", 0, 1.0), ("b", 1.0, 1.0)])
    with pytest.raises(ValueError, match="equal replays"):
        summarize_replays(one + one[:1], 2)
    other = _replay(50.0, [("a", 0, 1.0), ("c", 1.0, 1.0)])
    with pytest.raises(ValueError, match="replay 1"):
        summarize_replays(one + other, 2)
    with pytest.raises(ValueError, match="at least 1"):
        summarize_replays(one, 0)


@pytest.mark.gpu
def test_a_captured_chain_shows_its_kernels_in_order() -> None:
    x = torch.randn(1 << 20, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        y = torch.exp(x)
        z = torch.cumsum(y, 0)
    t = kernel_timeline(graph, replays=5)
    assert len(t.steps) >= 2 and t.replays == 5
    assert t.busy_us > 0 and t.span_us >= t.busy_us
    assert torch.isfinite(z).all()

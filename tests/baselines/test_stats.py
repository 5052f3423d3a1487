"""Statistics: intervals cover what they should, decisions follow the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from baselines.stats import (
    RatioInterval,
    decide,
    geomean_ratio_interval,
    paired_ratio_halfwidth,
    rank_test,
    ratio_interval,
    summarize,
)


def noisy(center: float, n: int, seed: int, spread: float = 0.01) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(center * (1 + spread * rng.standard_normal(n)))


def test_summary_interval_brackets_the_median() -> None:
    s = summarize(noisy(2.0, 41, 1))
    assert s.ci_low <= s.median <= s.ci_high
    assert abs(s.median - 2.0) < 0.02
    assert s.n == 41


def test_ratio_of_equal_distributions_is_same() -> None:
    interval = ratio_interval(noisy(1.0, 40, 2, 0.002), noisy(1.0, 40, 3, 0.002))
    assert interval.ci_low < 1.0 < interval.ci_high
    assert decide(interval, 0.005) == "same"


def test_three_percent_faster_candidate_is_faster() -> None:
    interval = ratio_interval(noisy(1.03, 30, 4, 0.002), noisy(1.0, 30, 5, 0.002))
    assert 1.02 < interval.ratio < 1.04
    assert decide(interval, 0.005) == "faster"
    assert (
        decide(ratio_interval(noisy(1.0, 30, 6, 0.002), noisy(1.03, 30, 7, 0.002)), 0.005)
        == "slower"
    )


def test_wide_interval_is_ambiguous() -> None:
    assert decide(RatioInterval(1.01, 0.99, 1.03, 5, 0.5), 0.005) == "ambiguous"


def test_rank_test_separates_shifted_samples() -> None:
    assert rank_test(noisy(1.0, 30, 8), noisy(1.1, 30, 9)) < 1e-6
    assert rank_test(noisy(1.0, 30, 10), noisy(1.0, 30, 11)) > 0.01


def test_geomean_interval_weights_shapes() -> None:
    fast = (noisy(2.0, 20, 12, 0.001), noisy(1.0, 20, 13, 0.001))
    same = (noisy(1.0, 20, 14, 0.001), noisy(1.0, 20, 15, 0.001))
    heavy_fast = geomean_ratio_interval([fast, same], [3.0, 1.0])
    heavy_same = geomean_ratio_interval([fast, same], [1.0, 3.0])
    assert heavy_fast.ratio > heavy_same.ratio > 1.0
    assert abs(heavy_fast.ratio - 2**0.75) < 0.01
    assert heavy_fast.ci_low <= heavy_fast.ratio <= heavy_fast.ci_high


def test_paired_halfwidth_is_the_ratio_intervals() -> None:
    a, b = noisy(1.0, 25, 16, 0.01), noisy(1.02, 25, 17, 0.01)
    interval = ratio_interval(a, b, n_boot=200)
    half = (interval.ci_high - interval.ci_low) / (2 * interval.ratio)
    assert paired_ratio_halfwidth(a, b, n_boot=200) == pytest.approx(half)
    assert paired_ratio_halfwidth(a[:1], b[:1]) == math.inf
    assert paired_ratio_halfwidth([0.0, 0.0, 0.0], b[:3]) == math.inf
    with pytest.raises(ValueError, match="equal lengths"):
        paired_ratio_halfwidth(a, b[:-1])

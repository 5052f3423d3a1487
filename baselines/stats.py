"""Statistics of timings: medians with bootstrap intervals, paired ratio intervals, a rank test,
and the faster/slower/same/ambiguous decision rule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_BOOT = 2000


@dataclass(frozen=True)
class Summary:
    median: float
    ci_low: float
    ci_high: float
    n: int

    @property
    def rel_halfwidth(self) -> float:
        return (self.ci_high - self.ci_low) / (2 * self.median) if self.median > 0 else math.inf

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_groups(
    groups: list[list[float]], confidence: float = 0.95, n_boot: int = DEFAULT_BOOT, seed=None
) -> Summary:
    """The median of all values, with an interval from a two-level bootstrap: each replicate
    draws groups with replacement, then values within each drawn group. Groups are separate
    processes (or hosts): what one process holds fixed for its life varies between groups, and
    this interval covers it where pooling the values would not."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups if len(g)]
    if not arrays:
        raise ValueError("no values to summarize")
    if len(arrays) == 1:
        return summarize(arrays[0].tolist(), confidence, n_boot, seed)
    pooled = np.concatenate(arrays)
    rng = _rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        drawn = rng.integers(0, len(arrays), size=len(arrays))
        boots[b] = np.median(
            np.concatenate(
                [arrays[g][rng.integers(0, arrays[g].size, arrays[g].size)] for g in drawn]
            )
        )
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    med = float(np.median(pooled))
    return Summary(med, float(min(lo, med)), float(max(hi, med)), int(pooled.size))


@dataclass(frozen=True)
class RatioInterval:
    """ratio = median(baseline) / median(candidate): above 1 means the candidate is faster."""

    ratio: float
    ci_low: float
    ci_high: float
    n: int
    rank_p: float

    def to_dict(self) -> dict:
        return asdict(self)


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(0x5EED if seed is None else seed)


def summarize(
    values: list[float], confidence: float = 0.95, n_boot: int = DEFAULT_BOOT, seed=None
) -> Summary:
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values to summarize")
    med = float(np.median(x))
    if x.size == 1:
        return Summary(med, med, med, 1)
    idx = _rng(seed).integers(0, x.size, size=(n_boot, x.size))
    boots = np.median(x[idx], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return Summary(med, float(lo), float(hi), int(x.size))


def ratio_interval(
    baseline: list[float],
    candidate: list[float],
    confidence: float = 0.95,
    n_boot: int = DEFAULT_BOOT,
    seed=None,
) -> RatioInterval:
    """Bootstrap of the ratio of medians; pairs are resampled together when the blocks were
    interleaved (equal lengths), independently otherwise."""
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("both sides need at least one value")
    ratio = float(np.median(a) / np.median(b))
    rng = _rng(seed)
    if a.size == b.size:
        idx = rng.integers(0, a.size, size=(n_boot, a.size))
        boots = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    else:
        ia = rng.integers(0, a.size, size=(n_boot, a.size))
        ib = rng.integers(0, b.size, size=(n_boot, b.size))
        boots = np.median(a[ia], axis=1) / np.median(b[ib], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return RatioInterval(ratio, float(lo), float(hi), int(min(a.size, b.size)), rank_test(a, b))


def paired_ratio_halfwidth(
    baseline: list[float],
    candidate: list[float],
    confidence: float = 0.95,
    n_boot: int = 200,
    seed=None,
) -> float:
    """Relative half-width, (high - low) / (2 ratio), of `ratio_interval`'s interval without the
    rank test: what a stopping rule checks after a block. Infinite when a median is not positive
    or there are fewer than two pairs."""
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.size != b.size:
        raise ValueError(f"paired blocks need equal lengths, got {a.size} and {b.size}")
    if a.size < 2 or not (np.median(a) > 0 and np.median(b) > 0):
        return math.inf
    idx = _rng(seed).integers(0, a.size, size=(n_boot, a.size))
    boots = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return float((hi - lo) / (2 * (np.median(a) / np.median(b))))


def rank_test(a, b) -> float:
    """Two-sided Mann-Whitney U p-value (normal approximation with tie correction)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n1, n2 = a.size, b.size
    if n1 == 0 or n2 == 0:
        return 1.0
    both = np.concatenate([a, b])
    order = both.argsort(kind="mergesort")
    ranks = np.empty_like(both)
    sorted_vals = both[order]
    i = 0
    while i < both.size:
        j = i
        while j + 1 < both.size and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    tie = (counts**3 - counts).sum() / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12 * ((n + 1) - tie)
    if var <= 0:
        return 1.0
    z = (u1 - n1 * n2 / 2) / math.sqrt(var)
    return float(math.erfc(abs(z) / math.sqrt(2)))


def decide(interval: RatioInterval, threshold: float) -> str:
    """`faster` when the whole interval clears 1 + threshold, `slower` when it lies under
    1 / (1 + threshold), `same` when it lies inside both bounds, `ambiguous` otherwise."""
    up = 1.0 + threshold
    down = 1.0 / up
    if interval.ci_low > up:
        return "faster"
    if interval.ci_high < down:
        return "slower"
    if interval.ci_low >= down and interval.ci_high <= up:
        return "same"
    return "ambiguous"


def geomean(values: list[float]) -> float:
    x = np.asarray(values, dtype=np.float64)
    return float(np.exp(np.log(x).mean()))


def geomean_ratio_interval(
    pairs: list[tuple[list[float], list[float]]],
    weights: list[float] | None = None,
    confidence: float = 0.95,
    n_boot: int = DEFAULT_BOOT,
    seed=None,
) -> RatioInterval:
    """Weighted geometric mean over shapes of median(baseline)/median(candidate), with a bootstrap
    interval that resamples every shape's blocks in each replicate."""
    if not pairs:
        raise ValueError("no shapes to combine")
    w = np.asarray(weights if weights is not None else [1.0] * len(pairs), dtype=np.float64)
    w = w / w.sum()
    rng = _rng(seed)
    logs = np.zeros(n_boot)
    point = 0.0
    for weight, (base, cand) in zip(w, pairs, strict=True):
        a = np.asarray(base, dtype=np.float64)
        b = np.asarray(cand, dtype=np.float64)
        point += weight * np.log(np.median(a) / np.median(b))
        if a.size == b.size:
            idx = rng.integers(0, a.size, size=(n_boot, a.size))
            ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
        else:
            ratios = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1) / np.median(
                b[rng.integers(0, b.size, (n_boot, b.size))], axis=1
            )
        logs += weight * np.log(ratios)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(np.exp(logs), [alpha, 1 - alpha])
    n = min(min(len(a), len(b)) for a, b in pairs)
    all_a = np.concatenate([np.asarray(a) / np.median(a) for a, _ in pairs])
    all_b = np.concatenate([np.asarray(b) / np.median(a) for a, b in pairs])
    return RatioInterval(float(np.exp(point)), float(lo), float(hi), n, rank_test(all_a, all_b))

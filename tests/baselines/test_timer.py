"""The timer's host-clock path, the interleaving order, the tamper check, the stopping rule and the
L2 flush (on the CPU), and the decision procedure on simulated noise."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from baselines import timer
from baselines.stats import decide, paired_ratio_halfwidth, ratio_interval
from baselines.timer import (
    L2Flush,
    StoppingRule,
    cpu_block,
    measure_interleaved,
    run_interleaved,
    tampered,
)


def test_cpu_block_measures_each_call() -> None:
    samples = cpu_block(lambda: time.sleep(0.002), 4)
    assert len(samples) == 4
    assert all(s >= 0.002 for s in samples)


def test_interleaving_pairs_each_random_order_with_its_reverse() -> None:
    calls: list[str] = []

    def runner(name: str):
        def run(n: int) -> list[float]:
            calls.append(name)
            return [1.0] * n

        return run

    names = ["A", "B", "C"]
    rule = StoppingRule(samples_per_block=2, min_blocks=40, max_blocks=40, warmup=1)
    medians = run_interleaved([runner(x) for x in names], rule)
    assert medians == [[1.0] * 40] * 3
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(40)]
    assert all(sorted(r) == names for r in rounds)
    assert all(rounds[r + 1] == rounds[r][::-1] for r in range(0, 40, 2))
    # Over 20 pairs the first runner of a pair is not always the same one, so no runner always
    # follows the same neighbour (a fixed ABBA order would give one first runner only).
    assert len({rounds[r][0] for r in range(0, 40, 2)}) > 1


def test_max_time_stops_only_after_min_blocks() -> None:
    def slow(n: int) -> list[float]:
        time.sleep(0.02)
        return [1.0] * n

    rule = StoppingRule(samples_per_block=1, min_blocks=6, max_blocks=100, max_time_s=0.001)
    result = measure_interleaved([slow, slow], rule)
    assert result.blocks == 6 and result.stop_reason == "max_time"


def test_throttled_blocks_are_measured_again() -> None:
    seen = []

    def on_block(index: int, block: int, samples: list[float]) -> bool:
        seen.append(block)
        return len(seen) != 1  # the very first block is "throttled"

    rule = StoppingRule(samples_per_block=1, min_blocks=2, max_blocks=2, warmup=0)
    medians = run_interleaved([lambda n: [1.0] * n], rule, on_block)
    assert len(medians[0]) == 2
    assert seen[:2] == [0, 0]


def test_patching_the_clock_is_seen(monkeypatch) -> None:
    assert tampered() == []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    assert tampered() == ["torch.cuda.synchronize"]
    monkeypatch.undo()
    assert tampered() == []
    assert timer._perf_counter is time.perf_counter


# --- the stopping rule (deterministic fake block functions; no timing assertions) ----------


def fixed(values_per_block: list[float]):
    """A runner whose k-th block has every sample equal to values_per_block[k % len]."""
    calls: list[int] = []

    def run(n: int) -> list[float]:
        calls.append(n)
        return [values_per_block[(len(calls) - 1) % len(values_per_block)]] * n

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_paired_ratio_stops_at_min_blocks_when_drift_is_common() -> None:
    drift = [1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.8]  # 20 % swings, the same for both runners
    rule = StoppingRule(samples_per_block=2, min_blocks=6, max_blocks=60, max_time_s=60)
    paired = measure_interleaved([fixed(drift), fixed(drift)], rule)
    assert paired.stop_reason == "precision"
    assert paired.blocks == rule.min_blocks
    assert paired.halfwidth == 0.0
    each = measure_interleaved([fixed(drift), fixed(drift)], replace(rule, stop_on="each"))
    assert each.stop_reason == "max_blocks"
    assert each.blocks == rule.max_blocks


def test_one_runner_uses_its_own_median() -> None:
    rule = StoppingRule(samples_per_block=2, min_blocks=5, max_blocks=50, max_time_s=60)
    steady = measure_interleaved([fixed([1.0])], rule)
    assert (steady.stop_reason, steady.blocks) == ("precision", 5)
    noisy = measure_interleaved([fixed([1.0 + 0.1 * math.sin(k) for k in range(97)])], rule)
    assert noisy.stop_reason == "max_blocks"


def test_precision_reached_is_what_the_decision_sees() -> None:
    rng = np.random.default_rng(7)

    def runner(center: float):
        return lambda n: list(center * (1 + 0.01 * rng.standard_normal(n)))

    rule = StoppingRule(
        samples_per_block=5, min_blocks=10, max_blocks=500, max_time_s=60, ratio_halfwidth=0.001
    )
    result = measure_interleaved([runner(1.0), runner(1.0)], rule)
    assert result.stop_reason == "precision"
    assert result.blocks > rule.min_blocks  # 1 % noise needs more than 10 blocks for 0.1 %
    a, b = result.medians
    assert result.halfwidth == paired_ratio_halfwidth(a, b)
    assert result.halfwidth <= rule.ratio_halfwidth
    interval = ratio_interval(a, b)
    assert (interval.ci_high - interval.ci_low) / (2 * interval.ratio) < 2 * rule.ratio_halfwidth


def test_short_samples_get_longer_blocks() -> None:
    rule = StoppingRule(samples_per_block=10, min_blocks=3, max_blocks=3, min_block_s=1e-3)
    short = fixed([1e-5])
    result = measure_interleaved([short], rule)
    assert result.samples_per_block == 100
    assert short.calls == [rule.warmup, 100, 100, 100]
    assert result.n_samples == 300
    capped = fixed([1e-7])
    assert (
        measure_interleaved([capped], replace(rule, max_samples_per_block=400)).samples_per_block
        == 400
    )
    long = fixed([1e-2])
    assert measure_interleaved([long], rule).samples_per_block == 10
    off = fixed([1e-5])
    assert measure_interleaved([off], replace(rule, min_block_s=0.0)).samples_per_block == 10


def test_paired_runners_share_the_block_size_of_the_fastest() -> None:
    rule = StoppingRule(samples_per_block=4, min_blocks=2, max_blocks=2, min_block_s=1e-3)
    fast, slow = fixed([1e-5]), fixed([1e-4])
    result = measure_interleaved([slow, fast], rule)
    assert result.samples_per_block == 100
    assert slow.calls[1:] == fast.calls[1:] == [100, 100]


def test_a_fast_runner_does_not_stretch_a_slow_runners_blocks() -> None:
    rule = StoppingRule(samples_per_block=4, min_blocks=2, max_blocks=2, min_block_s=1e-3)
    fast, slow = fixed([1e-7]), fixed([1e-2])  # 1000 samples for the fast one's 1 ms block
    result = measure_interleaved([fast, slow], rule)
    assert fast.calls[1:] == [1000, 1000]
    assert slow.calls[1:] == [10, 10]  # its blocks stop at max_block_s (0.1 s), not 10 s
    assert result.sizes == [1000, 10] and result.samples_per_block == 1000


def test_time_limits(monkeypatch) -> None:
    now = [0.0]  # a fake clock that only moves when a block runs: no dependence on machine load
    monkeypatch.setattr(timer, "_perf_counter", lambda: now[0])
    calls: list[int] = []

    def sleepy(n: int) -> list[float]:
        calls.append(n)
        now[0] += 1 / 128  # a binary fraction, so the sums below are exact
        return [1.0 + 0.3 * math.sin(len(calls))] * n  # never precise enough to stop on

    rule = StoppingRule(samples_per_block=1, min_blocks=2, max_blocks=10_000, max_time_s=0.25)
    result = measure_interleaved([sleepy], rule)
    assert result.stop_reason == "max_time"
    assert result.blocks == 32  # 0.25 s of 1/128 s blocks, counted from after the warm-up
    calls.clear()
    warm = StoppingRule(samples_per_block=1, min_blocks=1, max_blocks=1, warmup=1, warmup_s=4 / 128)
    measure_interleaved([sleepy], warm)
    assert len(calls) == 4 + 1  # the warm-up repeats until warmup_s has passed, then one block


def test_run_interleaved_is_measure_interleaved_medians() -> None:
    rule = StoppingRule(samples_per_block=2, min_blocks=3, max_blocks=3)
    assert run_interleaved([fixed([2.0]), fixed([3.0])], rule) == [[2.0] * 3, [3.0] * 3]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"stop_on": "both"}, "stop_on"),
        ({"samples_per_block": 0}, "samples_per_block"),
        ({"min_blocks": 50, "max_blocks": 10}, "min_blocks"),
        ({"ratio_halfwidth": 0}, "ratio_halfwidth"),
        ({"max_time_s": -1}, "max_time_s"),
        ({"warmup": -1}, "warmup"),
        ({"samples_per_block": 20, "max_samples_per_block": 10}, "samples_per_block"),
    ],
)
def test_bad_rules_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StoppingRule(**changes)


def test_no_runner_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one runner"):
        measure_interleaved([])


@pytest.mark.parametrize("mode", ["read", "write", "write_read", "none"])
def test_l2_flush_modes_touch_the_buffer(mode: str) -> None:
    flush = L2Flush(4096, torch.device("cpu"), mode)
    if mode == "none":
        assert flush.buffer.numel() == 0
    else:
        assert flush.buffer.numel() == 1024
    flush.buffer.fill_(1)
    flush()
    written = mode in ("write", "write_read")
    assert bool((flush.buffer == 0).all()) == (written or mode == "none")
    if mode == "read":
        assert int(flush.sink) == 1024  # the read really summed the buffer
    with pytest.raises(ValueError, match="flush"):
        L2Flush(4096, torch.device("cpu"), "evict")


# --- the decision procedure, simulated: calibration and power of the default rule ----------


def simulated_runner(rng: np.random.Generator, center: float, state: dict):
    """Blocks of lognormal samples around `center` times a drift shared through `state`."""

    def run(n: int) -> list[float]:
        state["drift"] *= float(np.exp(0.0005 * rng.standard_normal()))
        return list(
            1e-4 * center * state["drift"] * np.exp(state["noise"] * rng.standard_normal(n))
        )

    return run


def simulated_decisions(effect: float, count: int, noise: float, seed: int) -> Counter:
    """`count` decisions of the default rule between block functions whose samples are lognormal
    around 1 and 1 + effect, with a drift common to both (a clock wandering) that pairing
    cancels. The 1e-4 s samples get the rule's longer blocks."""
    rng = np.random.default_rng(seed)
    verdicts: Counter = Counter()
    rule = replace(StoppingRule(), max_time_s=60)
    for _ in range(count):
        state = {"drift": 1.0, "noise": noise}
        runners = [simulated_runner(rng, 1.0, state), simulated_runner(rng, 1.0 + effect, state)]
        result = measure_interleaved(runners, rule)
        verdicts[decide(ratio_interval(*result.medians), 0.005)] += 1
    return verdicts


def test_default_rule_is_calibrated_on_simulated_noise() -> None:
    aa = simulated_decisions(0.0, 60, noise=0.01, seed=11)
    assert aa["faster"] + aa["slower"] <= 1
    slower = simulated_decisions(0.01, 60, noise=0.01, seed=12)
    assert slower["slower"] >= 57

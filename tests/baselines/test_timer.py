"""The timer's host-clock path, the interleaving order and the tamper check."""

from __future__ import annotations

import time

import torch

from baselines import timer
from baselines.timer import StoppingRule, cpu_block, run_interleaved, tampered


def test_cpu_block_measures_each_call() -> None:
    samples = cpu_block(lambda: time.sleep(0.002), 4)
    assert len(samples) == 4
    assert all(s >= 0.002 for s in samples)


def test_interleaving_alternates_order_and_respects_max_blocks() -> None:
    calls: list[str] = []

    def runner(name: str):
        def run(n: int) -> list[float]:
            calls.append(name)
            return [1.0] * n

        return run

    rule = StoppingRule(samples_per_block=2, min_blocks=4, max_blocks=4, warmup=1)
    medians = run_interleaved([runner("A"), runner("B")], rule)
    assert medians == [[1.0] * 4, [1.0] * 4]
    assert calls[2:] == ["A", "B", "B", "A", "A", "B", "B", "A"]


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

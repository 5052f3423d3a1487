"""The perturbed re-verification rounds change what they say: about the given share of each
floating input's elements, and always at least one element of the first, so that a cache keyed
on a few sampled values hits and is stale."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from loop.tasks import load_task
from loop.worker import PERTURB_FRACTIONS, _perturbed


@pytest.fixture(scope="module")
def case():
    task = load_task("rmsnorm")
    shape = next(s for s in task.shapes("cpu") if s.name == "decode-7x256")
    ctx = SimpleNamespace(torch=torch, device="cpu", secret=12345, task=task)
    return ctx, shape, task.make_inputs(shape, 1, "cpu")


def changed(before: tuple, after: tuple) -> list[int]:
    return [int((a != b).sum()) for a, b in zip(before, after, strict=True)]


def test_a_round_with_share_zero_changes_exactly_one_element_of_the_first_input(case) -> None:
    assert 0.0 in PERTURB_FRACTIONS
    ctx, shape, inputs = case
    counts = [changed(inputs, _perturbed(ctx, shape, inputs, 0.0, salt)) for salt in range(20)]
    assert counts == [[1, 0]] * 20


def test_each_round_changes_about_its_share(case) -> None:
    ctx, shape, inputs = case
    sizes = [t.numel() for t in inputs]
    for fraction in (f for f in PERTURB_FRACTIONS if f > 0):
        counts = [changed(inputs, _perturbed(ctx, shape, inputs, fraction, s)) for s in range(50)]
        for i, size in enumerate(sizes):
            mean = sum(c[i] for c in counts) / len(counts)
            assert 0.5 * fraction * size < mean + (i == 0) < 2 * fraction * size + 1, (i, mean)


def test_the_rounds_leave_their_input_alone(case) -> None:
    ctx, shape, inputs = case
    kept = tuple(t.clone() for t in inputs)
    _perturbed(ctx, shape, inputs, 0.02, 3)
    assert all(torch.equal(a, b) for a, b in zip(inputs, kept, strict=True))

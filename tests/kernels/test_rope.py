"""The NeoX rotary embedding task: reference, inputs, shapes, and its shipped candidates on the
CPU (Triton under the interpreter, a ragged head count and head_dim too) against a wrong kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loop.tasks import load_task
from tests.kernels.task_checks import (
    assert_shipped_accepted,
    assert_wrong_rejected,
    evaluate_with_wrong,
    gpu_evaluate,
)

# GPT-J style: rotates interleaved pairs instead of halves.
WRONG = """
import torch
LANGUAGE = "torch"
def kernel(x, cos, sin):
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("rope")


def test_reference_matches_the_formula(task) -> None:
    shape = task.shapes("cpu")[2]
    x, cos, sin = task.make_inputs(shape, 3, "cpu")
    got = task.reference(x.double(), cos.double(), sin.double()).numpy()
    xn, c, s = x.double().numpy(), cos.double().numpy()[:, None], sin.double().numpy()[:, None]
    half = shape.dims["head_dim"] // 2
    x1, x2 = xn[..., :half], xn[..., half:]
    np.testing.assert_allclose(got, np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1))


def test_inputs_are_seeded_and_a_rotation(task) -> None:
    shape = task.shapes("cpu")[-1]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    x, cos, sin = a
    np.testing.assert_allclose((cos**2 + sin**2).numpy(), 1.0, rtol=1e-6)
    y = task.reference(x.double(), cos.double(), sin.double())
    half = shape.dims["head_dim"] // 2
    pair_norm = lambda t: t[..., :half] ** 2 + t[..., half:] ** 2  # noqa: E731
    np.testing.assert_allclose(pair_norm(y).numpy(), pair_norm(x.double()).numpy(), rtol=1e-6)


def test_gpu_shapes_and_traffic(task) -> None:
    shapes = task.shapes("cuda")
    assert {s.dtype for s in shapes} == {"bfloat16"}
    assert {s.dims["head_dim"] for s in shapes} == {128}
    assert max(s.dims["tokens"] for s in shapes) >= 131072
    big = next(s for s in shapes if s.name == "long-32768x32x128")
    assert task.bytes_moved(big) == 2 * 2 * 32768 * 32 * 128 + 4 * 32768 * 128


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_rope.py", {"compute": "input"}),
            ("triton_rope.py", {"head_block": 2, "tokens_per_program": 4, "store_cache": ".cs"}),
            ("triton_rope.py", {}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


@pytest.mark.gpu
def test_shipped_candidates_on_gpu(task) -> None:
    ev = gpu_evaluate(task, [("triton_rope.py", {}), ("torch_rope.py", {})])
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons

"""The residual add + RMSNorm task: reference, inputs, shapes, and its shipped candidates on the
CPU (Triton under the interpreter) against a wrong kernel."""

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

# Normalises x before the residual is added: the classic mistake in a fused add + norm.
WRONG = """
import torch
LANGUAGE = "torch"
def kernel(x, residual, weight):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    return y.to(x.dtype), x + residual
"""


@pytest.fixture(scope="module")
def task():
    return load_task("add_rmsnorm")


def test_reference_matches_the_formula(task) -> None:
    shape = task.shapes("cpu")[0]
    x, r, w = (t.double() for t in task.make_inputs(shape, 3, "cpu"))
    y, h = task.reference(x, r, w)
    hn = x.numpy() + r.numpy()
    want = hn / np.sqrt((hn**2).mean(-1, keepdims=True) + 1e-6) * w.numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(h.numpy(), hn, rtol=1e-15)


def test_inputs_are_seeded_and_outputs_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    y, h = task.reference(*(t.double() for t in a))
    assert 0.5 < float(y.abs().mean()) < 2.0
    assert 0.5 < float(h.abs().mean()) < 3.0


def test_gpu_shapes_and_traffic(task) -> None:
    shapes = task.shapes("cuda")
    assert {s.dtype for s in shapes} == {"bfloat16"}
    assert min(s.dims["tokens"] for s in shapes) == 1
    assert max(s.dims["tokens"] for s in shapes) >= 131072
    big = next(s for s in shapes if s.name == "long-32768x7168")
    assert task.bytes_moved(big) == 2 * (4 * 32768 * 7168 + 7168)


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_add_rmsnorm.py", {"sum_dtype": "input", "chunk_rows": 64}),
            (
                "triton_add_rmsnorm.py",
                {"num_warps": 2, "rows_per_program": 4, "store_cache": ".cs"},
            ),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


@pytest.mark.gpu
def test_shipped_candidates_on_gpu(task) -> None:
    ev = gpu_evaluate(task, [("triton_add_rmsnorm.py", {}), ("torch_add_rmsnorm.py", {})])
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons

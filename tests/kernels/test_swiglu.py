"""The SwiGLU task: reference, inputs, shapes, and its shipped candidates on the CPU (Triton
under the interpreter) against a wrong kernel."""

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

# Gate and up swapped: silu(up) * gate.
WRONG = """
import torch
LANGUAGE = "torch"
def kernel(x):
    d = x.shape[-1] // 2
    up, gate = x[:, :d].float(), x[:, d:].float()
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("swiglu")


def test_reference_matches_the_formula(task) -> None:
    shape = task.shapes("cpu")[0]
    (x,) = task.make_inputs(shape, 3, "cpu")
    got = task.reference(x.double()).numpy()
    xn = x.double().numpy()
    gate, up = xn[:, : shape.dims["ffn"]], xn[:, shape.dims["ffn"] :]
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * up, rtol=1e-12)


def test_inputs_are_seeded_and_outputs_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    (a,), (b,), (c,) = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0.3 < float(task.reference(a.double()).abs().mean()) < 3.0


def test_gpu_shapes_and_traffic(task) -> None:
    shapes = task.shapes("cuda")
    assert {s.dtype for s in shapes} == {"bfloat16"}
    assert {s.dims["ffn"] for s in shapes} == {14336, 18432}
    big = next(s for s in shapes if s.name == "long-32768x18432")
    assert task.bytes_moved(big) == 2 * 3 * 32768 * 18432


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_swiglu.py", {"compute": "input"}),
            ("triton_swiglu.py", {"block": 512, "rows_per_program": 4, "store_cache": ".cs"}),
            ("triton_swiglu.py", {"block": 512, "rows_per_program": 2, "order": "memory"}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


@pytest.mark.gpu
def test_shipped_candidates_on_gpu(task) -> None:
    ev = gpu_evaluate(task, [("triton_swiglu.py", {}), ("torch_swiglu.py", {})])
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons

"""The RMSNorm task: its reference, inputs, shapes and shipped candidates (CPU; Triton under the
interpreter, in a worker where TRITON_INTERPRET is set before Triton loads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task


@pytest.fixture(scope="module")
def task():
    return load_task("rmsnorm")


def test_reference_matches_the_formula(task) -> None:
    shape = task.shapes("cpu")[0]
    x, w = task.make_inputs(shape, 7, "cpu")
    got = task.reference(x.double(), w.double()).numpy()
    xn = x.double().numpy()
    want = xn / np.sqrt((xn**2).mean(-1, keepdims=True) + 1e-6) * w.double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_inputs_are_seeded_nonzero_and_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    a = task.make_inputs(shape, 11, "cpu")
    b = task.make_inputs(shape, 11, "cpu")
    c = task.make_inputs(shape, 12, "cpu")
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    out = task.reference(a[0].double(), a[1].double())
    assert 0.5 < float(out.abs().mean()) < 2.0


def test_gpu_shapes_span_decode_to_long_context(task) -> None:
    shapes = task.shapes("cuda")
    tokens = {s.dims["tokens"] for s in shapes}
    assert min(tokens) == 1 and max(tokens) >= 131072
    assert {s.dims["hidden"] for s in shapes} == {4096, 7168}
    assert {s.dtype for s in shapes} == {"bfloat16"}
    assert len({s.seed for s in shapes}) == len(shapes)


def test_bytes_and_flops(task) -> None:
    shape = next(
        s for s in task.shapes("cuda") if s.dims["tokens"] == 32768 and s.dims["hidden"] == 7168
    )
    assert task.bytes_moved(shape) == 2 * (2 * 32768 * 7168 + 7168)
    assert task.flops(shape) == 4 * 32768 * 7168


@pytest.mark.parametrize(
    "candidate, params",
    [
        ("torch_rmsnorm.py", {"method": "vector_norm", "chunk_rows": 64}),
        ("triton_rmsnorm.py", {"num_warps": 4, "rows_per_program": 2}),
        ("triton_rmsnorm.py", {"num_warps": 4, "chunk": 1024, "x_eviction": "evict_first"}),
    ],
)
def test_shipped_candidates_match_the_reference_on_cpu(task, candidate, params) -> None:
    ev = evaluate(task, [CandidateSpec(task.folder / candidate, params)], "cpu")
    verdict = ev.verdicts[0]
    assert verdict.accepted, verdict.reasons
    assert max(s.rel_err for s in verdict.shapes.values()) < 1e-5


@pytest.mark.gpu
def test_shipped_candidates_match_the_reference_on_gpu(task) -> None:
    specs = [
        CandidateSpec(task.folder / "triton_rmsnorm.py", {"num_warps": 8}, "triton"),
        CandidateSpec(task.folder / "torch_rmsnorm.py", {}, "torch"),
    ]
    ev = evaluate(task, specs, "cuda")
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons

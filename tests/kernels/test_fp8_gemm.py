"""The fp8 GEMM task (per-tensor and block scales): reference, inputs, shapes, peers, and its
shipped candidates on the CPU (fp8 tensors work there; Triton under the interpreter) against a
kernel that applies the wrong activation scales."""

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

# Uses each row's first activation scale for all of k: right per tensor, wrong with k-blocks.
WRONG = """
import torch
LANGUAGE = "torch"
def kernel(a, a_scale, w, w_scale):
    n, k = w.shape
    full = w_scale.repeat_interleave(n // w_scale.shape[0], 0)
    wf = w.float() * full.repeat_interleave(k // w_scale.shape[1], 1)
    af = a.float() * a_scale[:, :1]
    return (af[:, None, :] * wf[None, :, :]).sum(-1).to(torch.bfloat16)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("fp8_gemm")


def _by_name(task, device: str, name: str):
    return next(s for s in task.shapes(device) if s.name == name)


@pytest.mark.parametrize("name", ["tensor-m5-n48-k64", "block-m5-n32-k96"])
def test_reference_is_the_product_of_the_dequantised_operands(task, name) -> None:
    shape = _by_name(task, "cpu", name)
    a, sa, w, sw = (t.to(torch.float64).numpy() for t in task.make_inputs(shape, 3, "cpu"))
    got = task.reference(*(torch.from_numpy(t) for t in (a, sa, w, sw))).numpy()
    (m, k), n = a.shape, w.shape[0]
    ad = np.empty_like(a)
    wd = np.empty_like(w)
    for i in range(m):
        for j in range(k):
            ad[i, j] = a[i, j] * sa[i * sa.shape[0] // m, j * sa.shape[1] // k]
    for i in range(n):
        for j in range(k):
            wd[i, j] = w[i, j] * sw[i * sw.shape[0] // n, j * sw.shape[1] // k]
    np.testing.assert_allclose(got, ad @ wd.T, rtol=1e-12, atol=1e-12)


def test_inputs_are_seeded_fp8_with_scales_that_differ_by_tile(task) -> None:
    shape = _by_name(task, "cpu", "block-m33-n48-k64")
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    q_a, s_a, q_w, s_w = a
    assert q_a.dtype == q_w.dtype == torch.float8_e4m3fn
    assert s_a.dtype == s_w.dtype == torch.float32
    assert s_a.shape == (33, 64 // 16) and s_w.shape == (48 // 16, 64 // 16)
    assert float(s_a.max() / s_a.min()) > 3.0 and float(s_w.max() / s_w.min()) > 3.0
    assert float(q_a.float().abs().max()) == 448.0  # each tile's amax maps to the fp8 maximum
    ref = task.reference(*(t.double() for t in a))
    assert 0.2 < float(ref.abs().mean()) < 5.0
    per_tensor = task.make_inputs(_by_name(task, "cpu", "tensor-m5-n48-k64"), 5, "cpu")
    assert per_tensor[1].shape == per_tensor[3].shape == (1, 1)


def test_gpu_shapes_are_fp8_checkpoints_from_decode_to_prefill(task) -> None:
    shapes = task.shapes("cuda")
    assert {s.dims["scaling"] for s in shapes} == {"tensor", "block"}
    assert {s.dtype for s in shapes} == {"float8_e4m3fn"}
    assert {d for s in shapes for d in task.output_dtypes(s, 1)} == {"bfloat16"}
    assert min(s.dims["m"] for s in shapes) == 1 and max(s.dims["m"] for s in shapes) >= 4096
    for s in shapes:
        assert 4096 <= s.dims["k"] <= 18432 and 4096 <= s.dims["n"] <= 18432
        assert s.dims["n"] % 128 == 0 and s.dims["k"] % 128 == 0
    shape = _by_name(task, "cuda", "block-m16-n18432-k7168")
    scales = 16 * 56 + 144 * 56
    assert task.bytes_read_written(shape) == (7168 * (16 + 18432) + 4 * scales, 2 * 16 * 18432)
    assert task.flops(shape) == 2 * 16 * 18432 * 7168


def test_scaled_mm_is_a_gpu_only_peer_and_the_fallbacks_agree(task) -> None:
    assert "scaled-mm" not in task.default_peers("cpu")
    assert {"eager", "torch.compile", "scaled-mm"} <= set(task.default_peers("cuda"))
    inputs = task.make_inputs(_by_name(task, "cpu", "block-m5-n48-k64"), 1, "cpu")
    want = task.reference(*(t.double() for t in inputs))
    got = task.peers["eager"](*inputs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_candidates_on_cpu_and_wrong_scales(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_fp8_gemm.py", {"chunk_n": 16}),
            ("triton_fp8_gemm.py", {"block_m": 16, "block_n": 32, "block_k": 32, "num_stages": 1}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev, tolerance=6e-3)
    assert_wrong_rejected(ev)


@pytest.mark.gpu
def test_shipped_candidates_on_gpu(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            ("triton_fp8_gemm.py", {}),
            ("triton_fp8_gemm.py", {"block_m": 64, "block_n": 64, "block_k": 64, "group_m": 1}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tensor-m16-n6144-k4096", "block-m128-n7168-k16384"])
def test_scaled_mm_peer_matches_the_reference_on_gpu(task, name) -> None:
    inputs = task.make_inputs(_by_name(task, "cuda", name), 2, "cuda")
    want = task.reference(*(t.double() for t in inputs))
    got = task.peers["scaled-mm"](*inputs).double()
    assert float((got - want).norm() / want.norm()) < task.tolerance("bfloat16")

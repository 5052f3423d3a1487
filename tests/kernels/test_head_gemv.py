"""The per-head GEMV task (MLA's absorbed projections): reference, inputs, shapes, and its
shipped candidates on the CPU (Triton under the interpreter, with and without tensor cores, and
ragged blocks) against a wrong kernel and a mutant."""

from __future__ import annotations

import json

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.task_checks import (
    assert_interpreted_and_mutant_caught,
    assert_shipped_accepted,
    assert_weights_stream_before_the_wait,
    assert_wrong_rejected,
    candidate_module,
    evaluate_with_wrong,
    gpu_evaluate,
    hopper_ptx,
    run_interpreted,
)

# Every head multiplied by head 0's weight.
WRONG = """
import torch
LANGUAGE = "torch"
def kernel(x, w):
    return (x.float()[:, :, None, :] * w.float()[0][None, None]).sum(-1).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("head_gemv")


def test_reference_is_each_heads_own_product(task) -> None:
    shape = task.shapes("cpu")[1]
    x, w = (t.double() for t in task.make_inputs(shape, 2, "cpu"))
    got = task.reference(x, w)
    for h in range(x.shape[1]):
        torch.testing.assert_close(got[:, h], x[:, h] @ w[h].T)


def test_inputs_are_seeded_and_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (4, 4, 5))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[1], c[1])
    y = task.reference(*(t.double() for t in a))
    assert 0.5 < float(y.std()) < 2.0


def test_gpu_shapes_are_deepseeks_absorbed_projections(task) -> None:
    shapes = task.shapes("cuda")
    assert {(s.dims["heads"], s.dims["n"], s.dims["k"]) for s in shapes} == {
        (128, 512, 128),
        (128, 128, 512),
    }
    assert {s.dims["batch"] for s in shapes} == {1, 16, 64}
    one = next(s for s in shapes if s.name == "b1-h128-n512-k128")
    assert task.bytes_moved(one) == 2 * 128 * (512 * 128 + 128 + 512)


def test_the_eager_peer_returns_the_tasks_layout_above_batch_1(task) -> None:
    """The harness wants a contiguous (batch, heads, n) output: bmm's heads-leading result
    transposed back is not one at batch 5, so the peer copies it (as the next projection's
    reshape does in the model)."""
    shape = next(s for s in task.shapes("cpu") if s.dims["batch"] == 5)
    x, w = task.make_inputs(shape, 1, "cpu")
    out = task.module.eager(x, w)
    assert out.is_contiguous()
    torch.testing.assert_close(
        out.double(), task.reference(x.double(), w.double()), rtol=1e-5, atol=1e-5
    )


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_head_gemv.py", {"chunk_heads": 1}),
            ("triton_head_gemv.py", {}),
            ("triton_head_gemv.py", {"block_m": 1, "block_n": 32, "block_k": 32, "use_dot": False}),
            ("triton_head_gemv.py", {"block_m": 4, "block_n": 16, "block_k": 64, "use_dot": False}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


def test_a_lost_last_column_of_k_is_caught(task, tmp_path) -> None:
    """A kernel that drops the last column of each head's k is a mismatch."""
    assert_interpreted_and_mutant_caught(
        task,
        "triton_head_gemv.py",
        {"block_m": 16, "block_n": 16, "block_k": 32},
        ("k_ok = kk < K", "k_ok = kk < K - 1"),
        tmp_path,
    )


def test_a_kernel_that_declares_strided_inputs_but_ignores_the_strides_is_caught(
    task, tmp_path
) -> None:
    """The evaluator gives a candidate that declares STRIDED_INPUTS its inputs as views too: a
    copy of the Triton kernel that addresses x as if contiguous passes on contiguous inputs
    and is a mismatch on the views."""
    assert_interpreted_and_mutant_caught(
        task,
        "triton_head_gemv.py",
        {"block_m": 16, "block_n": 16, "block_k": 32},
        (
            "x_rows = x_ptr + rm.to(tl.int64) * stride_xb + head.to(tl.int64) * stride_xh",
            "x_rows = x_ptr + (rm.to(tl.int64) * H + head) * K",
        ),
        tmp_path,
    )


def test_the_triton_kernel_refuses_what_it_cannot_run(task) -> None:
    kernel = candidate_module(task, "triton_head_gemv.py").kernel
    x = torch.zeros(1, 3, 24)
    with pytest.raises(ValueError, match=r"w must be \(3, n, 24\)"):
        kernel(x, torch.zeros(3, 40, 25))
    with pytest.raises(ValueError, match="use_dot needs"):
        kernel(x, torch.zeros(3, 40, 24), block_m=1)
    many = torch.zeros(1, 65536, 1).expand(1, 65536, 24)
    with pytest.raises(ValueError, match="65536 heads: at most 65535"):
        kernel(many, torch.zeros(1, 1, 24).expand(65536, 1, 24))
    assert kernel(torch.zeros(0, 3, 24), torch.zeros(3, 40, 24)).shape == (0, 3, 40)


@pytest.mark.parametrize(
    "block_m, block_n, block_k, use_dot", [(16, 64, 128, True), (1, 32, 128, False)]
)
def test_the_first_weight_tile_streams_before_the_wait_on_sm90(
    task, block_m, block_n, block_k, use_dot
) -> None:
    """Compiled for sm_90 (no GPU needed): the first weight tile's loads (16-byte vectors,
    evict-first) come before griddepcontrol.wait; x is read, and y written, after it; and the
    kernel after it is not let launch early."""
    module = candidate_module(task, "triton_head_gemv.py")
    types = dict.fromkeys(("x_ptr", "w_ptr", "y_ptr"), "*bf16")
    types |= dict.fromkeys(("B", "H", "N", "K", "stride_xb", "stride_xh"), "i32")
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
    constexprs |= {"USE_DOT": use_dot, "PDL": True}
    ptx = hopper_ptx(module._head_gemv, types, constexprs, 4, multiples_of_16=("N", "K"))
    vectors = block_n * block_k * 2 // 16 // (32 * 4)
    assert_weights_stream_before_the_wait(ptx, vectors, triggers=False, later_weights=True)


def test_fp32_inputs_with_use_dot_are_not_rounded_to_tf32_on_sm90(task) -> None:
    """Compiled for sm_90 (no GPU needed): with use_dot, fp32 x and w are multiplied in fp32 on
    the CUDA cores (tl.dot's default would round them to TF32, 10 mantissa bits, on the tensor
    cores); bf16 takes the tensor cores."""
    module = candidate_module(task, "triton_head_gemv.py")
    constexprs = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "USE_DOT": True, "PDL": False}
    shapes = dict.fromkeys(("B", "H", "N", "K", "stride_xb", "stride_xh"), "i32")
    ptx = {
        dtype: hopper_ptx(
            module._head_gemv,
            dict.fromkeys(("x_ptr", "w_ptr", "y_ptr"), dtype) | shapes,
            constexprs,
            4,
            multiples_of_16=("N", "K"),
        )
        for dtype in ("*fp32", "*bf16")
    }
    assert "tf32" not in ptx["*fp32"]
    assert "fma.rn.f32" in ptx["*fp32"]  # the products done on the CUDA cores
    assert "wgmma" in ptx["*bf16"] or "mma.sync" in ptx["*bf16"]


STRIDED = """
import json
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module

task = load_task("head_gemv")
module = candidate_module(task, "triton_head_gemv.py")
gen = torch.Generator().manual_seed(5)
b, h, n, k = 5, 3, 48, 40
# a head's k columns, then 24 others; a spare head, so the batch stride is not h times the
# head stride
q = torch.randn(b, h + 1, k + 24, generator=gen)
w = torch.randn(h, n, k, generator=gen)
x = q[:, :h, :k]
want = task.reference(x.double(), w.double())
across = torch.randn(b, k, h, generator=gen).transpose(1, 2)  # columns apart: copied
want_across = task.reference(across.double(), w.double())


def copied(*args, **kwargs):
    raise AssertionError("the kernel copied x")


x.contiguous = copied  # read in place, or fail
errors = []
for params in ({"block_m": 2, "block_n": 16, "block_k": 16, "use_dot": False},
               {"block_m": 16, "block_n": 16, "block_k": 32, "use_dot": True}):
    errors.append(float((module.kernel(x, w, **params).double() - want).abs().max()))
    got = module.kernel(across, w, **params).double()
    errors.append(float((got - want_across).abs().max()))
print(json.dumps(errors))
"""


def test_a_strided_query_slice_is_read_in_place_over_a_grid_of_several_blocks(task) -> None:
    """Under the interpreter: x a view of each head's first 40 of 64 columns (and of 3 of 4
    heads), 5 sequences in blocks of 2 and 48 outputs in blocks of 16 (a 3 x 3 first grid
    axis), against the reference; and an x whose columns are not adjacent, which is copied."""
    errors = json.loads(run_interpreted(STRIDED))
    assert len(errors) == 4 and max(errors) < 1e-4, errors


@pytest.mark.gpu
def test_shipped_candidates_on_gpu(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            ("triton_head_gemv.py", {}),
            (
                "triton_head_gemv.py",
                {"block_m": 1, "block_n": 16, "block_k": 128, "use_dot": False},
            ),
            ("torch_head_gemv.py", {}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons

"""The RMSNorm-into-linear task: reference, inputs, shapes, and its shipped candidates (CPU; the
CuPy kernel compiled by NVRTC here and run only on a GPU)."""

from __future__ import annotations

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.task_checks import (
    assert_dependents_launch_where_asked,
    assert_interpreted_and_mutant_caught,
    assert_shipped_accepted,
    assert_splitk_launches_compile,
    assert_streaming_gemv_covers_ragged_runs,
    assert_streaming_gemv_ptx,
    assert_weights_stream_before_the_wait,
    assert_wrong_rejected,
    candidate_module,
    evaluate_with_wrong,
    gpu_evaluate,
    hopper_ptx,
    kept_counts_after_interpreted_calls,
)

# Forgets the norm weight g: right only where g is all ones, which make_inputs never draws.
WRONG = """
import torch

LANGUAGE = "torch"
PARAMS = {}


def kernel(x, g, w):
    xf = x.float()
    normed = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6)
    return (normed[:, None, :] * w.float()[None, :, :]).sum(-1).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("rmsnorm_linear")


def test_reference_is_the_norm_then_the_product(task) -> None:
    x = torch.tensor([[3.0, -4.0]], dtype=torch.float64)  # mean square 12.5
    g = torch.tensor([2.0, 0.5], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    scale = (12.5 + task.module.EPS) ** -0.5
    want = torch.tensor([[6.0 * scale, -2.0 * scale, 4.0 * scale]], dtype=torch.float64)
    torch.testing.assert_close(task.reference(x, g, w), want)


def test_inputs_give_outputs_of_order_one_and_the_eager_peer_agrees(task) -> None:
    shape = task.shapes("cpu")[-1]
    x, g, w = task.module.make_inputs(shape.to_dict(), 3, "cpu")
    assert x.shape == (shape.dims["m"], shape.dims["k"]) and g.shape == (shape.dims["k"],)
    assert float(x.float().pow(2).mean()) > 2.0  # the norm has a scale to undo
    want = task.reference(x.double(), g.double(), w.double())
    assert 0.3 < float(want.std()) < 3.0
    got = task.peers["eager"](x, g, w).double()
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_gpu_shapes_are_the_projections_a_norm_feeds_at_decode(task) -> None:
    shapes = task.shapes("cuda")
    assert {(s.dims["n"], s.dims["k"]) for s in shapes} >= {(6144, 4096), (28672, 4096)}
    assert {s.dims["m"] for s in shapes} == {1, 4, 16}
    one = next(s for s in shapes if s.name == "m1-n6144-k4096")
    assert task.bytes_moved(one) == 2 * (4096 * (6144 + 1 + 1) + 6144)


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_rmsnorm_linear.py", {}),
            ("torch_rmsnorm_linear.py", {"chunk_n": 16, "round_normed": False}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


def test_the_triton_candidate_under_the_interpreter_and_a_mutant(task, tmp_path) -> None:
    # K of 72 padded to 128, two rows a program over 3 and 16 rows (the last program short)
    params = {"per_lane": 1, "block_n": 2, "rows": 2}
    bug = (  # forgets the norm weight g
        "acc = tl.sum(w.to(tl.float32) * (x * g.to(tl.float32))[None, :], axis=1)",
        "acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)",
    )
    assert_interpreted_and_mutant_caught(task, "triton_rmsnorm_gemv.py", params, bug, tmp_path)


@pytest.mark.parametrize("block_k", [64, 1024])
def test_the_streaming_gemv_under_the_interpreter_and_a_mutant(task, tmp_path, block_k) -> None:
    """K of 72 and 96 in two 64-wide chunks (the second short; the squares summed over both),
    and in one chunk (x g held in registers); two rows a tile, four programs over 20 and 32 row
    blocks, 1 to 16 rows of x. The mutant forgets the norm weight g."""
    params = {"block_n": 2, "block_k": block_k, "num_stages": 3, "programs_per_sm": 1}
    bug = (
        ("xg_row = x_row * tl.load(g_ptr", "xg_row = x_row + 0 * tl.load(g_ptr")
        if block_k > 96
        else ("xg *= tl.load(g_ptr", "xg += 0 * tl.load(g_ptr")
    )
    candidate = "triton_rmsnorm_gemv_stream.py"
    assert_interpreted_and_mutant_caught(task, candidate, params, bug, tmp_path)


@pytest.mark.parametrize(
    "k,block_k,early_kib,tail",
    [
        (7168, 2048, 0, 0),
        (1536, 2048, 0, 0),
        (7168, 8192, 16, 0),
        (7168, 8192, 0, 8),
        (7168, 2048, 0, 4),
    ],
)
def test_the_streaming_gemv_pipelines_w_and_reads_nothing_before_the_wait(
    task, k, block_k, early_kib, tail
) -> None:
    """Compiled for sm_90 (no GPU needed): nothing but early_kib KiB of L2 prefetch before
    griddepcontrol.wait; W's tiles as 16-byte cp.async copies after it; the next kernel's launch
    after the run, or with a tail inside the loop."""
    module = candidate_module(task, "triton_rmsnorm_gemv_stream.py")
    types = dict.fromkeys(("x_ptr", "g_ptr", "w_ptr", "y_ptr"), "*bf16")
    types |= {"N": "i32", "progs": "i32", "eps": "fp32"}
    assert_streaming_gemv_ptx(
        module._rmsnorm_gemv_stream, types, k, block_k, early_kib, tail, module.LINE
    )


def test_the_streaming_gemv_covers_uneven_runs_and_a_short_last_block(task) -> None:
    assert_streaming_gemv_covers_ragged_runs(task, "triton_rmsnorm_gemv_stream.py")


def test_the_fused_gemv_compiles_at_every_launch_of_the_gpu_shapes(task) -> None:
    assert_splitk_launches_compile(task, "cupy_rmsnorm_gemv.py")


@pytest.mark.gpu
def test_gpu_candidates_match_the_reference(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            ("cupy_rmsnorm_gemv.py", {}),
            ("cupy_rmsnorm_gemv.py", {"per_lane": 2, "n_per_block": 1, "rows": 1}),
            ("triton_rmsnorm_gemv.py", {}),
            ("triton_rmsnorm_gemv_stream.py", {}),
            (
                "triton_rmsnorm_gemv_stream.py",
                {"block_n": 4, "block_k": 1024, "overlap": True, "early_kib": 16},
            ),
            ("triton_rmsnorm_gemv_stream.py", {"block_k": 2048, "tail_tiles": 4}),
            ("triton_rmsnorm_gemm.py", {}),
            ("triton_rmsnorm_gemm.py", {"split_k": 4, "block_n": 32, "x_ahead": True}),
            ("triton_rmsnorm_gemm.py", {"split_k": 2, "late_dependents": True}),
            ("torch_rmsnorm_linear.py", {}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "candidate,params",
    [
        ("cupy_rmsnorm_gemv.py", {"per_lane": 2, "n_per_block": 2, "rows": 4}),
        ("triton_rmsnorm_gemv.py", {"per_lane": 2, "block_n": 2, "rows": 4}),
        ("triton_rmsnorm_gemv_stream.py", {"block_n": 4, "block_k": 1024, "programs_per_sm": 1}),
        ("triton_rmsnorm_gemv_stream.py", {"block_n": 2, "block_k": 8192}),
        ("triton_rmsnorm_gemm.py", {"block_n": 64, "block_k": 128, "split_k": 4}),
        ("triton_rmsnorm_gemm.py", {"block_n": 32, "block_k": 64, "x_ahead": True}),
    ],
)
def test_the_fused_gemv_normalises_each_row_on_its_own(task, candidate, params) -> None:
    """Rows of very different scales (and one of zeros, where only eps keeps it finite) in one
    launch, a K that leaves lanes short, and more rows than a launch takes."""
    module = candidate_module(task, candidate)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for m, n, k in [(3, 1000, 4104), (4, 64, 8), (9, 300, 4096)]:
        x = torch.randn(m, k, generator=gen, device="cuda")
        x *= torch.logspace(-3, 3, m, device="cuda")[:, None]
        x[1] = 0
        x = x.bfloat16()
        g = torch.randn(k, generator=gen, device="cuda").mul_(0.25).add_(1).bfloat16()
        w = torch.randn(n, k, generator=gen, device="cuda").mul_(k**-0.5).bfloat16()
        got = module.kernel(x, g, w, **params).double()
        want = task.reference(x.double(), g.double(), w.double())
        assert torch.isfinite(got).all() and float(got[1].abs().max()) == 0.0
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=f"m{m} n{n} k{k}")


@pytest.mark.parametrize("k,per_lane,block_n,rows", [(4096, 2, 1, 1), (8192, 4, 2, 4)])
def test_the_triton_gemv_streams_w_before_waiting_on_the_kernel_before_it(
    task, k, per_lane, block_n, rows
) -> None:
    """Compiled for sm_90 (no GPU needed): W's loads, all at once, and the norm weight's come
    before griddepcontrol.wait; x is read, and y written, after it."""
    module = candidate_module(task, "triton_rmsnorm_gemv.py")
    k_pad = 1 << (k - 1).bit_length()
    warps = module.warps_for(block_n, k_pad, per_lane)
    types = dict.fromkeys(("x_ptr", "g_ptr", "w_ptr", "y_ptr"), "*bf16")
    types |= {"M": "i32", "N": "i32", "eps": "fp32"}
    constexprs = {"K": k, "K_PAD": k_pad, "BLOCK_N": block_n, "ROWS": rows, "PDL": True}
    ptx = hopper_ptx(module._rmsnorm_gemv, types, constexprs, warps)
    g_vectors = k_pad // 8 // (32 * warps)
    assert_weights_stream_before_the_wait(ptx, block_n * g_vectors, other_early=g_vectors)


@pytest.mark.gpu
def test_the_triton_gemv_waits_for_the_kernel_that_writes_x(task) -> None:
    """Launched with programmatic dependent launch right after a kernel that writes x 200 us
    late, it still reads the new x (W and g stream early; they are never written); and so does
    the streaming GEMV launched to overlap, over several chunks of K with 64 KiB of W asked of
    L2 first, and over one."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_rmsnorm_gemv.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "m1-n6144-k4096")
    x, g, w = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), g.double(), w.double())
    assert_waits_for_late_inputs(lambda x: module.kernel(x, g, w), (x,), want)
    stream = candidate_module(task, "triton_rmsnorm_gemv_stream.py")
    overlapping = (
        {"block_k": 1024, "overlap": True, "early_kib": 64},
        {"block_k": 4096, "overlap": True},
    )
    for params in overlapping:
        assert_waits_for_late_inputs(lambda x, p=params: stream.kernel(x, g, w, **p), (x,), want)


@pytest.mark.parametrize("split_k,x_ahead", [(1, False), (2, False), (1, True), (2, True)])
def test_the_tensor_core_candidate_under_the_interpreter_and_a_mutant(
    task, tmp_path, split_k, x_ahead
) -> None:
    """One K slice, and two (K of 72 and 96 in 64-wide steps: the last program of a
    tile adds the slices' partials and sums of squares). The mutant forgets the norm weight g."""
    params = {"block_n": 16, "block_k": 64, "split_k": split_k, "x_ahead": x_ahead}
    bug = ("xg = (xf * g.to(tl.float32)[None, :]).to(x.dtype)", "xg = x")
    assert_interpreted_and_mutant_caught(task, "triton_rmsnorm_gemm.py", params, bug, tmp_path)


def test_the_tensor_core_candidate_sums_the_squares_of_every_slice(task, tmp_path) -> None:
    """A mutant whose last program scales by its own slice's sum of squares alone is rejected."""
    params = {"block_n": 16, "block_k": 64, "split_k": 2}
    bug = ("squares += tl.load(tile_squares + s * BLOCK_M)", "pass")
    assert_interpreted_and_mutant_caught(task, "triton_rmsnorm_gemm.py", params, bug, tmp_path)


def test_the_tensor_core_candidate_reads_x_through_its_row_stride(task, tmp_path) -> None:
    """It declares STRIDED_INPUTS, so the evaluator also runs it on views with gaps between rows
    (as DeepSeek's q_a slice comes): a mutant that steps rows by K reads the gaps, is rejected."""
    params = {"block_n": 16, "block_k": 64, "split_k": 2}
    bug = ("rm[:, None].to(tl.int64) * stride_xm", "rm[:, None].to(tl.int64) * K")
    assert_interpreted_and_mutant_caught(task, "triton_rmsnorm_gemm.py", params, bug, tmp_path)


def test_the_tensor_core_candidate_leaves_its_counts_at_zero(task) -> None:
    """Three calls under the interpreter, the second on more tiles (the kept count buffer
    grows): each right, and every count back at 0, so no call pays a zero-fill."""
    calls = """
for rows, n, k in [(3, 40, 72), (17, 96, 200), (3, 40, 72)]:
    x, g = torch.randn(rows, k, generator=gen), torch.randn(k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    got = m.kernel(x, g, w, block_n=16, block_k=64, split_k=3)
    want = task.reference(x.double(), g.double(), w.double()).float()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
"""
    counts = kept_counts_after_interpreted_calls(task, "triton_rmsnorm_gemm.py", calls)
    assert counts == [0, 0]


def _tensor_core_ptx(task, **constexprs) -> str:
    """The sm_90 PTX of the tensor-core kernel at DeepSeek-V3's q_a/kv_a tiles (64 x 128, PDL
    on), with `constexprs` (SPLITS, X_AHEAD, LATE_DEPENDENTS)."""
    module = candidate_module(task, "triton_rmsnorm_gemm.py")
    types = dict.fromkeys(("x_ptr", "g_ptr", "w_ptr", "y_ptr"), "*bf16")
    types |= {"part_ptr": "*fp32", "squares_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    types |= dict.fromkeys(("M", "N", "K", "stride_xm", "k_per_split"), "i32")
    constexprs |= {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "PDL": True}
    aligned = ("N", "K", "stride_xm", "k_per_split")
    return hopper_ptx(module._rmsnorm_gemm, types, constexprs, 4, 3, aligned)


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("x_ahead", [False, True])
def test_the_tensor_core_kernel_streams_its_first_w_tile_before_the_wait(
    task, splits, x_ahead
) -> None:
    """Compiled for sm_90 (no GPU needed): the first W tile's loads come before
    griddepcontrol.wait; everything else after it; the products on tensor cores."""
    ptx = _tensor_core_ptx(task, SPLITS=splits, X_AHEAD=x_ahead, LATE_DEPENDENTS=False)
    assert_weights_stream_before_the_wait(ptx, 64 * 128 * 2 // 16 // 128)
    assert "mma.sync" in ptx


@pytest.mark.parametrize("late", [False, True])
def test_late_dependents_lets_the_next_kernel_launch_only_after_the_products(task, late) -> None:
    """Compiled for sm_90: by default the next kernel may launch right after the wait; with
    late_dependents only after the K loop's last product."""
    ptx = _tensor_core_ptx(task, SPLITS=2, X_AHEAD=True, LATE_DEPENDENTS=late)
    assert_dependents_launch_where_asked(ptx, late)


@pytest.mark.gpu
@pytest.mark.parametrize("x_ahead,late", [(False, False), (True, True)])
def test_the_tensor_core_kernel_waits_for_the_kernel_that_writes_x(task, x_ahead, late) -> None:
    """Launched with programmatic dependent launch right after a kernel that writes x 200 us
    late, it still reads the new x (its first W tile streams early; W is never written)."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_rmsnorm_gemm.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "m16-n2112-k7168")
    x, g, w = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), g.double(), w.double())

    def run(x):
        return module.kernel(x, g, w, split_k=4, x_ahead=x_ahead, late_dependents=late)

    assert_waits_for_late_inputs(run, (x,), want)

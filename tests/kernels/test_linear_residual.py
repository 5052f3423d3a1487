"""The linear-plus-residual task: reference, inputs, shapes, and its shipped candidates (CPU; the
CuPy kernel compiled by NVRTC here and run only on a GPU)."""

from __future__ import annotations

import itertools

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
    fit_an_sm,
    gpu_evaluate,
    hopper_build,
    hopper_ptx,
    kept_counts_after_interpreted_calls,
    registers_fit_an_sm,
    run_in_child,
    setmaxnreg_budgets,
    sm90_resources,
    ttgir_partitions,
)

# Drops the residual.
WRONG = """
import torch

LANGUAGE = "torch"
PARAMS = {}


def kernel(x, w, r):
    return (x.float()[:, None, :] * w.float()[None, :, :]).sum(-1).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("linear_residual")


def test_reference_is_the_product_plus_the_residual(task) -> None:
    x = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    r = torch.tensor([[10.0, -3.0]], dtype=torch.float64)
    want = torch.tensor([[11.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(task.reference(x, w, r), want)


def test_inputs_put_the_residual_above_the_product_and_the_eager_peer_agrees(task) -> None:
    shape = task.shapes("cpu")[-1]
    x, w, r = task.module.make_inputs(shape.to_dict(), 3, "cpu")
    assert r.shape == (shape.dims["m"], shape.dims["n"])
    product = x.double() @ w.double().t()
    assert float(r.double().std()) > 1.5 * float(product.std()) > 0.3
    want = task.reference(x.double(), w.double(), r.double())
    got = task.peers["eager"](x, w, r).double()
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_gpu_shapes_are_the_projections_onto_the_residual_stream(task) -> None:
    shapes = task.shapes("cuda")
    assert {(s.dims["n"], s.dims["k"]) for s in shapes} >= {(4096, 4096), (4096, 14336)}
    one = next(s for s in shapes if s.name == "m1-n4096-k14336")
    assert task.bytes_moved(one) == 2 * (14336 * (4096 + 1) + 4096 + 4096)


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_linear_residual.py", {}),
            ("torch_linear_residual.py", {"chunk_n": 16, "round_product": False}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


def test_the_triton_candidate_under_the_interpreter_and_a_mutant(task, tmp_path) -> None:
    # K of 72 padded to 128, two rows a program over 3 and 16 rows (the last program short)
    params = {"per_lane": 1, "block_n": 2, "rows": 2}
    bug = (  # drops the residual
        "acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1) + res",
        "acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)",
    )
    assert_interpreted_and_mutant_caught(task, "triton_gemv_residual.py", params, bug, tmp_path)


@pytest.mark.parametrize("block_k", [64, 1024])
def test_the_streaming_gemv_under_the_interpreter_and_a_mutant(task, tmp_path, block_k) -> None:
    """K of 72 and 96 in two 64-wide chunks (the second short), and in one chunk (x held in
    registers); two rows a tile, four programs over 20 and 32 row blocks, 1 to 16 rows
    of x. The mutant forgets the residual."""
    params = {"block_n": 2, "block_k": block_k, "num_stages": 3, "programs_per_sm": 1}
    bug = ("out = tl.sum(acc, axis=1) + res", "out = tl.sum(acc, axis=1)")
    assert_interpreted_and_mutant_caught(task, "triton_gemv_stream.py", params, bug, tmp_path)


@pytest.mark.parametrize(
    "block_k,early_kib,tail", [(2048, 0, 0), (16384, 0, 0), (4096, 16, 0), (2048, 0, 4)]
)
def test_the_streaming_gemv_pipelines_w_and_reads_nothing_before_the_wait(
    task, block_k, early_kib, tail
) -> None:
    """Compiled for sm_90 (no GPU needed): W's tiles stream through 16-byte cp.async copies into
    shared memory, every load and store comes after griddepcontrol.wait, and before it there is
    at most the L2 prefetch of early_kib KiB of W (one 128-byte line a lane). The next kernel may
    launch once the run is done, or with a tail inside the loop."""
    module = candidate_module(task, "triton_gemv_stream.py")
    types = dict.fromkeys(("x_ptr", "w_ptr", "r_ptr", "y_ptr"), "*bf16")
    types |= {"N": "i32", "progs": "i32"}
    assert_streaming_gemv_ptx(
        module._gemv_stream, types, 16384, block_k, early_kib, tail, module.LINE
    )


def test_the_streaming_gemv_covers_uneven_runs_and_a_short_last_block(task) -> None:
    assert_streaming_gemv_covers_ragged_runs(task, "triton_gemv_stream.py")


def test_the_fused_gemv_compiles_at_every_launch_of_the_gpu_shapes(task) -> None:
    assert_splitk_launches_compile(task, "cupy_gemv_residual.py")


@pytest.mark.gpu
def test_gpu_candidates_match_the_reference(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            ("cupy_gemv_residual.py", {}),
            ("cupy_gemv_residual.py", {"per_lane": 2, "n_per_block": 1, "rows": 1}),
            ("triton_gemv_residual.py", {}),
            ("triton_gemv_residual.py", {"block_n": 2, "per_lane": 8, "prefetch_ahead": 1024}),
            ("triton_gemv_stream.py", {}),
            (
                "triton_gemv_stream.py",
                {"block_n": 4, "block_k": 1024, "overlap": True, "early_kib": 16},
            ),
            ("triton_gemv_stream.py", {"block_k": 2048, "tail_tiles": 4}),
            ("triton_gemm_residual.py", {}),
            ("triton_gemm_residual.py", {"split_k": 1, "block_n": 32}),
            ("torch_linear_residual.py", {}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "candidate,params",
    [
        ("cupy_gemv_residual.py", {"per_lane": 2, "n_per_block": 2, "rows": 4}),
        ("triton_gemv_residual.py", {"per_lane": 2, "block_n": 2, "rows": 4}),
        ("triton_gemv_stream.py", {"block_n": 4, "block_k": 1024, "programs_per_sm": 1}),
        ("triton_gemm_residual.py", {"block_n": 64, "block_k": 128, "split_k": 4}),
    ],
)
def test_the_fused_gemv_adds_each_rows_own_residual(task, candidate, params) -> None:
    """A residual that differs by row and column, a K that leaves lanes short, and more rows
    than a launch takes."""
    module = candidate_module(task, candidate)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for m, n, k in [(3, 1000, 4104), (4, 64, 8), (9, 300, 4096)]:
        x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
        w = torch.randn(n, k, generator=gen, device="cuda").mul_(k**-0.5).bfloat16()
        r = torch.arange(m * n, device="cuda").reshape(m, n).float().div_(m * n).bfloat16()
        got = module.kernel(x, w, r, **params).double()
        want = task.reference(x.double(), w.double(), r.double())
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=f"m{m} n{n} k{k}")


@pytest.mark.parametrize(
    "k,per_lane,block_n,rows", [(4096, 2, 1, 1), (14336, 2, 1, 1), (28672, 2, 2, 4)]
)
def test_the_triton_gemv_streams_w_before_waiting_on_the_kernel_before_it(
    task, k, per_lane, block_n, rows
) -> None:
    """Compiled for sm_90 (no GPU needed): W's loads, all at once, come before
    griddepcontrol.wait; x and r are read, and y written, after it."""
    module = candidate_module(task, "triton_gemv_residual.py")
    k_pad = 1 << (k - 1).bit_length()
    warps = module.warps_for(block_n, k_pad, per_lane)
    types = dict.fromkeys(("x_ptr", "w_ptr", "r_ptr", "y_ptr"), "*bf16") | {"M": "i32", "N": "i32"}
    constexprs = {"K": k, "K_PAD": k_pad, "BLOCK_N": block_n, "ROWS": rows, "PDL": True}
    constexprs |= {"AHEAD": 0, "LINE": 64}
    ptx = hopper_ptx(module._gemv_residual, types, constexprs, warps)
    assert_weights_stream_before_the_wait(ptx, block_n * k_pad // 8 // (32 * warps))
    assert "prefetch" not in ptx


def test_prefetch_ahead_asks_l2_for_the_next_waves_rows_before_the_wait(task) -> None:
    """Compiled for sm_90 with prefetch_ahead: before griddepcontrol.wait each thread issues
    prefetch.global.L2 for one 128-byte line of the rows 1024 programs on (2 rows of 4096
    bfloat16: 128 lines over 4 warps), and none after it; the loads are as without it."""
    module = candidate_module(task, "triton_gemv_residual.py")
    types = dict.fromkeys(("x_ptr", "w_ptr", "r_ptr", "y_ptr"), "*bf16") | {"M": "i32", "N": "i32"}
    constexprs = {"K": 4096, "K_PAD": 4096, "BLOCK_N": 2, "ROWS": 1, "PDL": True}
    ptx = hopper_ptx(module._gemv_residual, types, constexprs | {"AHEAD": 1024, "LINE": 64}, 4)
    before, _, after = ptx.partition("griddepcontrol.wait")
    assert before.count("prefetch.global.L2") == 1
    assert "prefetch" not in after
    assert_weights_stream_before_the_wait(ptx, 2 * 4096 // 8 // (32 * 4))


@pytest.mark.gpu
def test_the_triton_gemv_waits_for_the_kernel_that_writes_x_and_r(task) -> None:
    """Launched with programmatic dependent launch right after kernels that write x and r
    200 us late, it still reads the new x and r (W streams early; it is never written), with
    the next wave's rows asked of L2 too; and so does the streaming GEMV launched to overlap, its
    first 64 KiB of W asked of L2 before it waits."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_gemv_residual.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "m1-n4096-k4096")
    x, w, r = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), w.double(), r.double())
    assert_waits_for_late_inputs(lambda x, r: module.kernel(x, w, r), (x, r), want)
    ahead = {"block_n": 2, "per_lane": 8, "prefetch_ahead": 1024}
    assert_waits_for_late_inputs(lambda x, r: module.kernel(x, w, r, **ahead), (x, r), want)
    stream = candidate_module(task, "triton_gemv_stream.py")
    early = {"block_k": 2048, "overlap": True, "early_kib": 64}
    assert_waits_for_late_inputs(lambda x, r: stream.kernel(x, w, r, **early), (x, r), want)


@pytest.mark.parametrize("params", [{"split_k": 1}, {"split_k": 2}])
def test_the_tensor_core_candidate_under_the_interpreter_and_a_mutant(task, tmp_path, params):
    """One K slice, and two (K of 72 and 96 in 64-wide steps: the last program of each tile
    sums the slices); the mutant forgets the residual where the slices meet."""
    params = {"block_n": 16, "block_k": 64, **params}
    bug = (
        "acc += tl.load(r_ptr + out, mask=out_ok, other=0.0).to(tl.float32)\n        tl.store",
        "tl.store",
    )
    assert_interpreted_and_mutant_caught(task, "triton_gemm_residual.py", params, bug, tmp_path)


def test_the_tensor_core_candidate_leaves_its_counts_at_zero(task) -> None:
    """Three calls under the interpreter, the second on more tiles (the kept count buffer
    grows): each right, and every count back at 0, so no call pays a zero-fill."""
    calls = """
for rows, n, k in [(3, 40, 72), (17, 96, 200), (3, 40, 72)]:
    x, r = torch.randn(rows, k, generator=gen), torch.randn(rows, n, generator=gen)
    w = torch.randn(n, k, generator=gen)
    got = m.kernel(x, w, r, block_n=16, block_k=64, split_k=3)
    torch.testing.assert_close(got, x @ w.t() + r, atol=1e-4, rtol=1e-4)
"""
    counts = kept_counts_after_interpreted_calls(task, "triton_gemm_residual.py", calls)
    assert counts == [0, 0]


def _tensor_core_ptx(task, splits: int, late: bool) -> str:
    """The sm_90 PTX of the tensor-core kernel at 64 x 128 tiles in `splits` slices, PDL on,
    late_dependents `late`."""
    module = candidate_module(task, "triton_gemm_residual.py")
    types = dict.fromkeys(("x_ptr", "w_ptr", "r_ptr", "y_ptr"), "*bf16")
    types |= {"part_ptr": "*fp32", "count_ptr": "*i32"}
    types |= dict.fromkeys(("M", "N", "K", "k_per_split"), "i32")
    constexprs = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLITS": splits, "PDL": True}
    constexprs["LATE_DEPENDENTS"] = late
    return hopper_ptx(module._gemm_residual, types, constexprs, 4, 3, ("N", "K", "k_per_split"))


@pytest.mark.parametrize("splits", [1, 4])
def test_the_tensor_core_kernel_streams_its_first_w_tile_before_the_wait(task, splits) -> None:
    """Compiled for sm_90 (no GPU needed) at 4096 x 4096: the first W tile's loads come before
    griddepcontrol.wait, everything else (x, r, the partials, the count) after it."""
    ptx = _tensor_core_ptx(task, splits, late=False)
    assert_weights_stream_before_the_wait(ptx, 64 * 128 * 2 // 16 // 128)
    assert "mma.sync" in ptx


@pytest.mark.parametrize("late", [False, True])
def test_late_dependents_lets_the_next_kernel_launch_only_after_the_products(task, late) -> None:
    """Compiled for sm_90 in 4 slices: the next kernel may launch right after the wait by
    default, only after the K loop's last product with late_dependents."""
    ptx = _tensor_core_ptx(task, 4, late)
    assert_dependents_launch_where_asked(ptx, late)


@pytest.mark.gpu
@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize(
    "candidate, shape_name, params",
    [
        ("triton_gemm_residual.py", "m16-n4096-k4096", {}),
        ("gluon_gemm_residual.py", "m16-n4096-k4096", {}),
        ("gluon_gemv_residual.py", "m1-n4096-k4096", {}),
        ("gluon_gemm_residual.py", "m16-n4096-k4096", {"residual_ahead": True}),
    ],
)
def test_the_kernels_that_stream_w_early_wait_for_the_kernel_that_writes_x_and_r(
    task, candidate, shape_name, params, late
) -> None:
    """Launched with programmatic dependent launch right after kernels that write x and r late,
    each still reads the new ones (its W streams, or is copied in, before the wait); also with
    late_dependents, which moves only where the kernel after it may launch (its place is
    checked in the sm_90 PTX), and with residual_ahead, which reads r right after the wait."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, candidate)
    shape = next(s for s in task.shapes("cuda") if s.name == shape_name)
    x, w, r = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), w.double(), r.double())

    def run(x, r):
        return module.kernel(x, w, r, late_dependents=late, **params)

    assert_waits_for_late_inputs(run, (x, r), want)


@pytest.mark.gpu
@pytest.mark.parametrize("candidate", ["triton_gemm_residual.py", "gluon_gemm_residual.py"])
def test_the_tensor_core_kernel_replays_in_a_graph_and_leaves_its_counts_at_zero(
    task, candidate
) -> None:
    """Replays of one captured call on new x each give the right sums, and leave every
    arrival count at 0 (no zero-fill between calls or replays)."""
    module = candidate_module(task, candidate)
    shape = next(s for s in task.shapes("cuda") if s.name == "m16-n4096-k14336")
    x, w, r = task.make_inputs(shape, 3, "cuda")
    module.kernel(x, w, r, split_k=4)  # the kept counts exist before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = module.kernel(x, w, r, split_k=4)
    for seed in range(3):
        x.copy_(task.make_inputs(shape, 10 + seed, "cuda")[0])
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = task.reference(x.double(), w.double(), r.double())
        torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)
    assert all(int(c.abs().sum()) == 0 for c in module._COUNTS[x.device])


def _zeros(m: int, n: int, k: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, ...]:
    """x, w and r of a linear + residual call, on the CPU."""
    return (
        torch.zeros(m, k, dtype=dtype),
        torch.zeros(n, k, dtype=dtype),
        torch.zeros(m, n, dtype=dtype),
    )


def _assert_refused(kernel, cases: list, fallback: str, k: int) -> None:
    """Each (inputs, params, why) of `cases` raises a ValueError naming why and pointing to
    `fallback`; so does a w whose K is not x's (`k`)."""
    for args, params, why in cases:
        with pytest.raises(ValueError, match=f"{why}.*use {fallback}"):
            kernel(*args, **params)
    with pytest.raises(ValueError, match=rf"w must be \(n, {k}\)"):
        kernel(torch.zeros(2, k), torch.zeros(64, k + 32), torch.zeros(2, 64))


GLUON = "gluon_gemm_residual.py"


def test_the_gluon_candidate_runs_on_the_gpu_only(task) -> None:
    assert GLUON in task.candidates["cuda"]
    assert GLUON not in task.candidates["cpu"]


def test_the_gluon_candidate_refuses_what_it_cannot_run_naming_why(task) -> None:
    """bf16 or fp16 only, K a multiple of 8 (TMA's strides), a ring that fits shared memory, on
    an sm_90 GPU: anything else is refused before any launch, pointing to the Triton kernel."""
    cases = [
        (_zeros(2, 64, 128, torch.float32), {}, "bf16 or fp16"),
        (_zeros(2, 64, 100), {}, "k 100: a multiple of 8"),
        (_zeros(2, 64, 128), {"block_k": 32}, "block_k 32"),
        (_zeros(2, 64, 128), {"num_stages": 1}, "num_stages 1"),
        (_zeros(2, 64, 128), {"block_k": 256, "num_stages": 6}, "needs 250"),
        (_zeros(2, 64, 128), {"programs_per_sm": 4}, "programs_per_sm 4: 1, 2 or 3 only"),
        (_zeros(2, 64, 128), {}, "needs an sm_90 GPU"),  # here on the CPU
    ]
    _assert_refused(candidate_module(task, GLUON).kernel, cases, "triton_gemm_residual.py", 128)


def test_the_gluon_slices_cover_k_in_whole_steps_with_none_empty(task) -> None:
    slice_steps = candidate_module(task, GLUON).slice_steps
    assert slice_steps(4096, 128, 2) == (16, 2)
    assert slice_steps(4096, 128, 3) == (11, 3)  # 11 + 11 + 10 steps
    assert slice_steps(14336, 128, 8) == (14, 8)
    assert slice_steps(200, 128, 4) == (1, 2)  # two steps: two slices, not four
    assert slice_steps(8, 256, 1) == (1, 1)
    for k, block_k, split in ((4104, 64, 3), (18432, 256, 4), (100, 64, 8)):
        per, slices = slice_steps(k, block_k, split)
        steps = -(-k // block_k)
        assert (slices - 1) * per < steps <= slices * per and slices <= split


def _gluon_types(module) -> dict[str, str]:
    """The Gluon kernel's runtime arguments' types at 16 x 4096 x 4096."""
    from triton.runtime.jit import mangle_type

    types = {
        "w_desc": mangle_type(
            module._descriptor(torch.zeros(4096, 4096, dtype=torch.bfloat16), 64)
        ),
        "x_desc": mangle_type(module._descriptor(torch.zeros(16, 4096, dtype=torch.bfloat16), 16)),
    }
    types |= dict.fromkeys(("r_ptr", "y_ptr"), "*bf16") | {"part_ptr": "*fp32"}
    return types | {"count_ptr": "*i32"} | dict.fromkeys(("M", "N", "K", "steps_per_split"), "i32")


@pytest.mark.parametrize(
    "block_k, stages, splits, late, programs, ahead",
    [
        (128, 8, 2, False, 1, False),
        (64, 12, 1, True, 1, False),
        (128, 5, 1, True, 1, True),
        (256, 4, 4, False, 1, False),
        (128, 5, 4, True, 2, True),
        (64, 5, 8, False, 3, True),
    ],
)
def test_the_gluon_kernel_builds_as_a_warpgroup_and_a_loader_warp(
    task, block_k, stages, splits, late, programs, ahead
) -> None:
    """Built for sm_90 at 4096 x 4096, under the register cap that lets `programs` programs
    share an SM: no spill, the ring within shared memory (`programs` times within an SM's), the
    loader warp on its own register budget, W and x by TMA into the ring and multiplied by
    wgmma 16 wide, and each partition waiting for the kernel before it (griddepcontrol.wait)."""
    module = candidate_module(task, GLUON)
    types = _gluon_types(module)
    constexprs = {"BLOCK_K": block_k, "STAGES": stages, "SPLITS": splits, "LATE_DEPENDENTS": late}
    constexprs["RESIDUAL_AHEAD"] = ahead
    cap = module.REGISTER_CAPS[programs]
    compiled = hopper_build(
        module._gemm_residual, types, constexprs, num_warps=4, max_registers=cap
    )
    used = sm90_resources(compiled)
    assert used["spill_bytes"] == 0 and registers_fit_an_sm(programs, used["registers"])
    assert 0 < used["shared_bytes"] <= module.shared_bytes(block_k, stages) <= module.SHARED_BYTES
    assert fit_an_sm(programs, module.shared_bytes(block_k, stages))
    ptx = compiled.asm["ptx"]
    assert 24 in setmaxnreg_budgets(ptx)
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async.sync.aligned.m64n16k16" in ptx
    assert ptx.count("griddepcontrol.wait") >= 2
    assert ptx.count("griddepcontrol.launch_dependents") >= 1
    assert ("atom" in ptx) == (splits > 1)


def _gluon_ttgir(task, splits: int, ahead: bool) -> str:
    """The Gluon kernel's TTGIR for sm_90 at 16 x 4096 x 4096."""
    module = candidate_module(task, GLUON)
    types = _gluon_types(module)
    constexprs = {"BLOCK_K": 128, "STAGES": 5, "SPLITS": splits, "LATE_DEPENDENTS": True}
    constexprs["RESIDUAL_AHEAD"] = ahead
    return hopper_build(module._gemm_residual, types, constexprs, num_warps=4).asm["ttgir"]


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("ahead", [False, True])
def test_where_the_warpgroup_loads_r(task, splits, ahead) -> None:
    """In the warpgroup's partition (the first), every load after griddepcontrol.wait: with
    residual_ahead, one load (r's) before the products' loop; without, every load after the
    loop (with one slice, r alone; with two, the partials and r)."""
    products = ttgir_partitions(_gluon_ttgir(task, splits, ahead))[0]
    loads = [i for i, line in enumerate(products) if "tt.load" in line]
    wait = next(i for i, line in enumerate(products) if "griddepcontrol.wait" in line)
    loop = next(i for i, line in enumerate(products) if "scf.for" in line)
    before = [i for i in loads if i < loop]
    assert len(before) == (1 if ahead else 0)
    assert all(wait < i for i in loads)
    assert len(loads) - len(before) == (0 if splits == 1 else splits) + (0 if ahead else 1)


# Each Gluon candidate at configurations across its parameters, over every GPU shape.
GLUON_GPU_CONFIGS = {
    "gluon_gemm_residual.py": [
        {},
        {"split_k": 1, "block_k": 64, "num_stages": 12},
        {"split_k": 3, "block_k": 256, "num_stages": 4, "late_dependents": True},
        {"split_k": 4, "block_k": 128, "num_stages": 5, "programs_per_sm": 2},
        {"split_k": 8, "block_k": 64, "num_stages": 5, "programs_per_sm": 3},
        {"split_k": 1, "num_stages": 5, "late_dependents": True, "residual_ahead": True},
        {"split_k": 3, "block_k": 64, "num_stages": 6, "residual_ahead": True},
    ],
    "gluon_gemv_residual.py": [
        {},
        {"rows": 16, "block_rows": 2, "num_stages": 8, "late_dependents": True},
        {"rows": 64, "block_rows": 4, "num_stages": 3, "num_warps": 8},
        {"rows": 8, "block_rows": 1, "num_stages": 2},
    ],
}


@pytest.mark.gpu
@pytest.mark.parametrize("candidate", sorted(GLUON_GPU_CONFIGS))
def test_the_gluon_candidates_match_the_reference_on_gpu(task, candidate) -> None:
    configs = GLUON_GPU_CONFIGS[candidate]
    ev = gpu_evaluate(task, [(candidate, params) for params in configs])
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


def _paths_script(candidate: str, cases: str, tail: str) -> str:
    """A script that runs `candidate` on each of `cases` ((m, n, k, dtype, params) lines) against
    the reference, checks that any arrival counts are back at zero, then runs `tail`."""
    return (
        """
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module

task = load_task("linear_residual")
module = candidate_module(task, "CANDIDATE")
gen = torch.Generator(device="cuda").manual_seed(2)
cases = [
CASES]
for m, n, k, dtype, params in cases:
    x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
    w = torch.randn(n, k, generator=gen, device="cuda").mul_(k**-0.5).to(dtype)
    r = torch.arange(m * n, device="cuda").reshape(m, n).float().div_(m * n).to(dtype)
    got = module.kernel(x, w, r, **params).double()
    want = task.reference(x.double(), w.double(), r.double())
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=f"m{m} n{n} k{k} {params}")
    counts = getattr(module, "_COUNTS", {}).get(x.device, [])
    assert all(int(c.abs().sum()) == 0 for c in counts), params
    print(m, n, k, dtype, params, "ok", flush=True)
""".replace("CANDIDATE", candidate).replace("CASES", cases)
        + tail
    )


# What the task's GPU shapes leave out: rows past 16 (a second row of programs) and short of
# it, N and K short of a tile, fp16, a short last slice, no rows and no K; each row's own
# residual; the counts back at zero after every call (graph replays: the test above). In a
# child process with a time limit: a hang fails the test.
GLUON_PATHS = _paths_script(
    "gluon_gemm_residual.py",
    """\
    (3, 1000, 4104, torch.bfloat16, {}),
    (4, 64, 8, torch.bfloat16, {"split_k": 1}),
    (17, 300, 4096, torch.float16, {"split_k": 3, "num_stages": 4}),
    (33, 130, 200, torch.bfloat16, {"split_k": 4, "block_k": 64}),
    (16, 4096, 14336, torch.bfloat16, {"split_k": 8, "block_k": 256, "num_stages": 4}),
    (1, 7168, 18432, torch.bfloat16, {"late_dependents": True}),
    (16, 4096, 14336, torch.bfloat16, {"split_k": 4, "num_stages": 5, "programs_per_sm": 2}),
    (17, 300, 4104, torch.float16, {"split_k": 1, "residual_ahead": True}),
    (33, 130, 200, torch.bfloat16, {"split_k": 3, "block_k": 64, "residual_ahead": True}),
""",
    """\
x = torch.randn(16, 4096, generator=gen, device="cuda").bfloat16()
w = torch.randn(4096, 4096, generator=gen, device="cuda").mul_(4096**-0.5).bfloat16()
r = torch.randn(16, 4096, generator=gen, device="cuda").bfloat16()
assert module.kernel(x[:0], w, r[:0]).shape == (0, 4096)
torch.testing.assert_close(module.kernel(x[:, :0], w[:, :0], r), r)
print("empty ok", flush=True)
""",
)


@pytest.mark.gpu
def test_the_gluon_candidate_paths_the_task_shapes_leave_out_on_gpu() -> None:
    run_in_child(GLUON_PATHS)


GEMV = "gluon_gemv_residual.py"


def test_the_gluon_gemv_runs_on_the_gpu_only(task) -> None:
    assert GEMV in task.candidates["cuda"]
    assert GEMV not in task.candidates["cpu"]


def test_the_gluon_gemv_refuses_what_it_cannot_run_naming_why(task) -> None:
    """bf16 or fp16 only, K a multiple of the columns of a step (256 a warp), groups that
    divide a program's rows, a buffer that fits shared memory, on an sm_90 GPU: anything else is
    refused before any launch, pointing to the Triton GEMV."""
    cases = [
        (_zeros(1, 64, 1024, torch.float32), {}, "bf16 or fp16"),
        (_zeros(1, 64, 1000), {}, "k 1000: a positive multiple of 1024"),
        (_zeros(1, 64, 1024), {"num_warps": 8}, "k 1024: a positive multiple of 2048"),
        (_zeros(1, 64, 2048), {"num_warps": 2}, "num_warps 2: 4 or 8 only"),
        (_zeros(1, 64, 1024), {"rows": 8, "block_rows": 3}, "rows 8 in groups of block_rows 3"),
        (_zeros(1, 64, 1024), {"rows": 12, "block_rows": 8}, "rows 12 in groups of block_rows 8"),
        (_zeros(1, 64, 1024), {"num_stages": 0}, "num_stages 0"),
        (_zeros(1, 8, 16384), {"block_rows": 8}, "block_rows 8 at k 16384: one buffer needs"),
        (_zeros(1, 64, 1024), {}, "needs an sm_90 GPU"),  # here on the CPU
    ]
    _assert_refused(candidate_module(task, GEMV).kernel, cases, "triton_gemv_residual.py", 1024)


def test_the_gluon_gemv_ring_takes_as_many_buffers_as_fit(task) -> None:
    """At Llama's o projection the whole ring, 7 buffers of 4 rows (224 KiB), fits; at the
    widest K one buffer of 4 rows does and none of 8; never more buffers than groups."""
    module = candidate_module(task, GEMV)
    assert module.ring_stages(4096, 32, 4, 7) == 7
    assert module.ring_stages(4096, 32, 4, 16) == 7  # 8 would not fit
    assert module.ring_stages(4096, 8, 4, 7) == 2  # two groups
    assert module.ring_stages(28672, 32, 4, 7) == 1
    assert module.ring_stages(28672, 32, 8, 7) == 0
    for k, block_rows in itertools.product((4096, 14336, 18432, 28672), (1, 2, 4)):
        stages = module.ring_stages(k, 64, block_rows, 16)
        assert module.shared_bytes(k, block_rows, stages) <= module.SHARED_BYTES
        assert stages == 16 or not fit_an_sm(1, module.shared_bytes(k, block_rows, stages + 1))


@pytest.mark.parametrize(
    "k, rows, block_rows, stages, late, warps",
    [
        (4096, 32, 4, 7, True, 8),  # Llama's o projection: all but one group before the wait
        (4096, 32, 8, 3, True, 8),
        (4096, 16, 2, 8, False, 4),  # every group before the wait, no refill
        (8192, 16, 2, 6, False, 8),
        (16384, 32, 2, 3, False, 8),  # refilled after each group from the fourth on
    ],
)
def test_the_gluon_gemv_copies_w_into_shared_memory_before_the_wait(
    task, k, rows, block_rows, stages, late, warps
) -> None:
    """Built for sm_90: no spill, the ring within shared memory; before griddepcontrol.wait
    W's boxes for every buffer by TMA (a box a step of a group) and nothing read or written
    otherwise; after it, x and r are asked of L1 and read, the buffers refilled while groups
    are left, y written, and the next kernel let in right after the wait or, late, after the
    loop."""
    from triton.runtime.jit import mangle_type

    module = candidate_module(task, GEMV)
    w = torch.zeros(64, k, dtype=torch.bfloat16)
    types = {"w_desc": mangle_type(module._descriptor(w, block_rows, warps))}
    types |= dict.fromkeys(("x_ptr", "r_ptr", "y_ptr"), "*bf16") | dict.fromkeys("MN", "i32")
    constexprs = {"K": k, "ROWS": rows, "STAGES": stages, "LATE_DEPENDENTS": late}
    compiled = hopper_build(module._gemv_residual, types, constexprs, num_warps=warps)
    used = sm90_resources(compiled)
    assert used["spill_bytes"] == 0
    ring = module.shared_bytes(k, block_rows, stages) - module.shared_bytes(k, block_rows, 0)
    assert ring <= used["shared_bytes"] <= module.shared_bytes(k, block_rows, stages)
    assert module.shared_bytes(k, block_rows, stages) <= module.SHARED_BYTES
    ptx = compiled.asm["ptx"]
    before, wait, after = ptx.partition("griddepcontrol.wait")
    assert wait and "griddepcontrol.wait" not in after
    steps = k // module.step(warps)  # a group's boxes
    assert before.count("cp.async.bulk.tensor.3d") == stages * steps
    assert "ld.global" not in before and "st.global" not in before and "prefetch" not in before
    lines = 32 * warps  # a thread a 128-byte line
    assert after.count("prefetch.global.L1") == -(-k // (lines * 64)) + 1  # x's, then r's
    assert after.index("prefetch.global.L1") < after.index("ld.global")
    refills = rows // block_rows > stages
    assert after.count("cp.async.bulk.tensor") == (steps if refills else 0)
    assert "ld.global" in after and "st.global" in after
    assert "griddepcontrol.launch_dependents" not in before
    assert after.count("griddepcontrol.launch_dependents") == 1
    launch = after.index("griddepcontrol.launch_dependents")
    if late:
        assert launch > after.rindex("st.global")
    else:
        assert launch < after.index("ld.shared")


# What the task's GPU shapes leave out: N short of a program's rows and of a group, fp16, rows
# of x past 4, one buffer refilled after every group, no rows of x; each row's own residual. In
# a child process with a time limit: a hang fails the test.
GEMV_PATHS = _paths_script(
    "gluon_gemv_residual.py",
    """\
    (1, 1000, 1024, torch.bfloat16, {}),
    (3, 37, 2048, torch.float16, {"rows": 16, "block_rows": 8, "num_stages": 2}),
    (5, 300, 4096, torch.bfloat16, {"rows": 64, "block_rows": 2, "num_stages": 4}),
    (1, 4100, 4096, torch.bfloat16, {"block_rows": 8, "num_stages": 3, "num_warps": 8}),
    (2, 130, 28672, torch.bfloat16, {"rows": 32, "block_rows": 4, "num_stages": 7}),
    (1, 4096, 4096, torch.bfloat16, {"late_dependents": True}),
""",
    """\
x = torch.randn(1, 4096, generator=gen, device="cuda").bfloat16()
w = torch.randn(4096, 4096, generator=gen, device="cuda").bfloat16()
assert module.kernel(x[:0], w, x[:0]).shape == (0, 4096)
print("empty ok", flush=True)
""",
)


@pytest.mark.gpu
def test_the_gluon_gemv_paths_the_task_shapes_leave_out_on_gpu() -> None:
    run_in_child(GEMV_PATHS)

"""The RMSNorm-gate/up-SwiGLU task: reference, inputs, shapes, and its shipped candidates (CPU;
Triton under the interpreter, and its sm_90 PTX compiled here)."""

from __future__ import annotations

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.task_checks import (
    GLUON_X_G_EVALUATED,
    GLUON_X_G_REGISTER_BUILDS,
    assert_dependents_launch_where_asked,
    assert_gluon_x_g_kernel_builds,
    assert_interpreted_and_mutant_caught,
    assert_shipped_accepted,
    assert_weights_stream_before_the_wait,
    assert_wrong_rejected,
    candidate_module,
    evaluate_with_wrong,
    gpu_evaluate,
    hopper_ptx,
    kept_counts_after_interpreted_calls,
    run_interpreted,
)

# Swaps gate and up: silu(up) * gate, right only where the two halves agree.
WRONG = """
import torch

LANGUAGE = "torch"
PARAMS = {}


def kernel(x, g, w):
    xf = x.float()
    normed = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * g.float()
    z = (normed[:, None, :] * w.float()[None, :, :]).sum(-1)
    up, gate = z.chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("rmsnorm_linear_swiglu")


def test_reference_is_the_norm_the_projections_then_swiglu(task) -> None:
    x = torch.tensor([[3.0, -4.0]], dtype=torch.float64)  # mean square 12.5
    g = torch.tensor([2.0, 0.5], dtype=torch.float64)
    # gate rows, then up rows
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    scale = (12.5 + task.module.EPS) ** -0.5
    gate = torch.tensor([6.0 * scale, -2.0 * scale], dtype=torch.float64)
    up = torch.tensor([4.0 * scale, -4.0 * scale], dtype=torch.float64)
    want = (gate / (1 + torch.exp(-gate)) * up)[None, :]
    torch.testing.assert_close(task.reference(x, g, w), want)


def test_inputs_give_outputs_of_order_one_and_the_eager_peer_agrees(task) -> None:
    shape = task.shapes("cpu")[-1]
    x, g, w = task.module.make_inputs(shape.to_dict(), 3, "cpu")
    f, k = shape.dims["f"], shape.dims["k"]
    assert x.shape == (shape.dims["m"], k) and g.shape == (k,) and w.shape == (2 * f, k)
    assert float(x.float().pow(2).mean()) > 2.0  # the norm has a scale to undo
    want = task.reference(x.double(), g.double(), w.double())
    assert want.shape == (shape.dims["m"], f)
    assert 0.1 < float(want.std()) < 3.0
    got = task.peers["eager"](x, g, w).double()
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_gpu_shapes_are_the_llama_mlps_at_decode(task) -> None:
    shapes = task.shapes("cuda")
    assert {(s.dims["f"], s.dims["k"]) for s in shapes} >= {(14336, 4096)}
    assert {s.dims["m"] for s in shapes} == {1, 4, 16}
    one = next(s for s in shapes if s.name == "m1-f14336-k4096")
    assert task.bytes_moved(one) == 2 * (4096 * (2 * 14336 + 1 + 1) + 14336)


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_rmsnorm_linear_swiglu.py", {}),
            ("torch_rmsnorm_linear_swiglu.py", {"chunk_f": 16, "round_normed": False}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


@pytest.mark.parametrize(
    "bug",
    [
        (  # forgets the norm weight g
            "xg = (x * g.to(tl.float32))[None, :]",
            "xg = x[None, :]",
        ),
        (  # reads the up rows from the gate's (the second half of W never read)
            "up_rows = w_ptr + (rn + F)[:, None]",
            "up_rows = w_ptr + rn[:, None]",
        ),
    ],
)
def test_the_triton_candidate_under_the_interpreter_and_a_mutant(task, tmp_path, bug) -> None:
    # K of 72 padded to 128, two rows a program over 3 and 16 rows (the last program short)
    params = {"per_lane": 1, "block_n": 2, "rows": 2}
    candidate = "triton_rmsnorm_gemv_swiglu.py"
    assert_interpreted_and_mutant_caught(task, candidate, params, bug, tmp_path)


@pytest.mark.parametrize("k,per_lane,block_n,rows", [(4096, 2, 1, 1), (8192, 4, 2, 4)])
def test_the_triton_kernel_streams_w_before_waiting_on_the_kernel_before_it(
    task, k, per_lane, block_n, rows
) -> None:
    """Compiled for sm_90 (no GPU needed): the gate's and up's W loads, all at once, and the
    norm weight's come before griddepcontrol.wait; x is read, and y written, after it."""
    module = candidate_module(task, "triton_rmsnorm_gemv_swiglu.py")
    k_pad = 1 << (k - 1).bit_length()
    warps = module.warps_for(block_n, k_pad, per_lane)
    types = dict.fromkeys(("x_ptr", "g_ptr", "w_ptr", "y_ptr"), "*bf16")
    types |= {"M": "i32", "F": "i32", "eps": "fp32"}
    constexprs = {"K": k, "K_PAD": k_pad, "BLOCK_N": block_n, "ROWS": rows, "PDL": True}
    ptx = hopper_ptx(module._rmsnorm_gemv_swiglu, types, constexprs, warps)
    g_vectors = k_pad // 8 // (32 * warps)
    assert_weights_stream_before_the_wait(ptx, 2 * block_n * g_vectors, other_early=g_vectors)


@pytest.mark.gpu
def test_gpu_candidates_match_the_reference(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            ("triton_rmsnorm_gemv_swiglu.py", {}),
            ("triton_rmsnorm_gemv_swiglu.py", {"per_lane": 4, "block_n": 2, "rows": 4}),
            ("triton_rmsnorm_gemm_swiglu.py", {}),
            ("triton_rmsnorm_gemm_swiglu.py", {"split_k": 4, "block_n": 32}),
            ("triton_rmsnorm_gemm_swiglu.py", {"split_k": 4, "block_n": 64, "x_ahead": True}),
            ("triton_rmsnorm_gemm_swiglu.py", {"x_ahead": True, "late_dependents": True}),
            ("torch_rmsnorm_linear_swiglu.py", {}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "candidate,params",
    [
        ("triton_rmsnorm_gemv_swiglu.py", {"per_lane": 2, "block_n": 2, "rows": 4}),
        ("triton_rmsnorm_gemm_swiglu.py", {"block_n": 64, "block_k": 128, "split_k": 4}),
        ("triton_rmsnorm_gemm_swiglu.py", {"block_n": 64, "block_k": 128, "x_ahead": True}),
        ("gluon_rmsnorm_gemm_swiglu.py", {"split_k": 3}),
        ("gluon_rmsnorm_gemm_swiglu.py", {"split_k": 2, "block_k": 128, "num_stages": 2}),
        ("gluon_rmsnorm_gemm_swiglu.py", {"split_k": 1, "num_stages": 3}),
    ],
)
def test_the_fused_kernel_normalises_each_row_on_its_own(task, candidate, params) -> None:
    """Rows of very different scales (and one of zeros, where only eps keeps it finite) in one
    launch, a K that leaves lanes short, an f the programs do not divide, and more rows than a
    program takes (the Gluon kernel also in fp16)."""
    module = candidate_module(task, candidate)
    gen = torch.Generator(device="cuda").manual_seed(2)
    shapes = [(3, 1001, 4104), (4, 64, 8), (9, 300, 4096), (17, 200, 4096)]
    shapes = [(*shape, torch.bfloat16) for shape in shapes]
    if candidate.startswith("gluon"):
        shapes.append((6, 136, 2048, torch.float16))
    for m, f, k, dtype in shapes:
        x = torch.randn(m, k, generator=gen, device="cuda")
        x *= torch.logspace(-3, 3, m, device="cuda")[:, None]
        x[1] = 0
        x = x.to(dtype)
        g = torch.randn(k, generator=gen, device="cuda").mul_(0.25).add_(1).to(dtype)
        w = torch.randn(2 * f, k, generator=gen, device="cuda").mul_(k**-0.5).to(dtype)
        got = module.kernel(x, g, w, **params).double()
        want = task.reference(x.double(), g.double(), w.double())
        assert torch.isfinite(got).all() and float(got[1].abs().max()) == 0.0
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=f"m{m} f{f} k{k} {dtype}")


@pytest.mark.gpu
def test_the_triton_kernel_waits_for_the_kernel_that_writes_x(task) -> None:
    """Launched with programmatic dependent launch right after a kernel that writes x 200 us
    late, it still reads the new x (W and g stream early; they are never written)."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_rmsnorm_gemv_swiglu.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "m1-f14336-k4096")
    x, g, w = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), g.double(), w.double())
    assert_waits_for_late_inputs(lambda x: module.kernel(x, g, w), (x,), want)


@pytest.mark.parametrize("split_k,x_ahead", [(1, False), (2, False), (1, True), (2, True)])
@pytest.mark.parametrize(
    "bug",
    [
        ("xg = (xf * g.to(tl.float32)[None, :]).to(x.dtype)", "xg = x"),  # forgets g
        ("up_rows = w_ptr + (rn + F)[:, None]", "up_rows = w_ptr + rn[:, None]"),  # up = gate
    ],
)
def test_the_tensor_core_candidate_under_the_interpreter_and_a_mutant(
    task, tmp_path, bug, split_k, x_ahead
) -> None:
    """One K slice, and two (K of 72 and 96 in 64-wide steps: the last program of a tile adds
    the slices' partials and sums of squares)."""
    params = {"block_n": 16, "block_k": 64, "split_k": split_k, "x_ahead": x_ahead}
    candidate = "triton_rmsnorm_gemm_swiglu.py"
    assert_interpreted_and_mutant_caught(task, candidate, params, bug, tmp_path)


def test_x_ahead_hands_each_step_its_own_x_under_the_interpreter(task, tmp_path) -> None:
    """One slice of two K steps (72 columns, the second step partial): with x_ahead the second
    step takes the x and g loaded during the first; a copy that keeps the first step's x is
    rejected."""
    params = {"block_n": 16, "block_k": 64, "split_k": 1, "x_ahead": True}
    bug = ("x, g = x_next, g_next", "g = g_next")
    assert_interpreted_and_mutant_caught(
        task, "triton_rmsnorm_gemm_swiglu.py", params, bug, tmp_path
    )


def test_the_tensor_core_candidate_leaves_its_counts_at_zero(task) -> None:
    """Three calls under the interpreter, the second on more tiles (the kept count buffer
    grows): each right, and every count back at 0, so no call pays a zero-fill."""
    calls = """
for rows, f, k in [(3, 40, 72), (17, 96, 200), (3, 40, 72)]:
    x, g = torch.randn(rows, k, generator=gen), torch.randn(k, generator=gen)
    w = torch.randn(2 * f, k, generator=gen)
    got = m.kernel(x, g, w, block_n=16, block_k=64, split_k=3)
    want = task.reference(x.double(), g.double(), w.double()).float()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
"""
    counts = kept_counts_after_interpreted_calls(task, "triton_rmsnorm_gemm_swiglu.py", calls)
    assert counts == [0, 0]


def _tensor_core_ptx(task, **constexprs) -> str:
    """The sm_90 PTX of the tensor-core kernel at Llama-3-8B's MLP tiles (64 x 128, PDL on),
    with `constexprs` (SPLITS, X_AHEAD, LATE_DEPENDENTS)."""
    module = candidate_module(task, "triton_rmsnorm_gemm_swiglu.py")
    types = dict.fromkeys(("x_ptr", "g_ptr", "w_ptr", "y_ptr"), "*bf16")
    types |= {"part_ptr": "*fp32", "squares_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    types |= dict.fromkeys(("M", "F", "K", "k_per_split"), "i32")
    constexprs |= {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "PDL": True}
    aligned = ("F", "K", "k_per_split")
    return hopper_ptx(module._rmsnorm_gemm_swiglu, types, constexprs, 4, 3, aligned)


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("x_ahead", [False, True])
def test_the_tensor_core_kernel_streams_its_first_w_tiles_before_the_wait(
    task, splits, x_ahead
) -> None:
    """Compiled for sm_90 (no GPU needed) at Llama-3-8B's MLP: the first gate and up W tiles'
    loads come before griddepcontrol.wait; everything else after it."""
    ptx = _tensor_core_ptx(task, SPLITS=splits, X_AHEAD=x_ahead, LATE_DEPENDENTS=False)
    assert_weights_stream_before_the_wait(ptx, 2 * 64 * 128 * 2 // 16 // 128)
    assert "mma.sync" in ptx


@pytest.mark.parametrize("late", [False, True])
def test_late_dependents_lets_the_next_kernel_launch_only_after_the_products(task, late) -> None:
    """Compiled for sm_90: by default the next kernel may launch right after the wait, before
    any product; with late_dependents only after the K loop's last one. Either way after the
    wait (the next kernel's own wait is for this one to end)."""
    ptx = _tensor_core_ptx(task, SPLITS=2, X_AHEAD=True, LATE_DEPENDENTS=late)
    assert_dependents_launch_where_asked(ptx, late)


@pytest.mark.gpu
@pytest.mark.parametrize("x_ahead,late", [(False, False), (True, True)])
def test_the_tensor_core_kernel_waits_for_the_kernel_that_writes_x(task, x_ahead, late) -> None:
    """Its own wait, with and without x_ahead (x loaded a step ahead, after the wait); with
    late_dependents too, which moves only where the kernel after it may launch."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_rmsnorm_gemm_swiglu.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "m16-f14336-k4096")
    x, g, w = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), g.double(), w.double())

    def run(x):
        return module.kernel(x, g, w, split_k=2, x_ahead=x_ahead, late_dependents=late)

    assert_waits_for_late_inputs(run, (x,), want)


def test_the_tensor_core_candidate_keeps_float32_partials_whatever_torchs_default(task) -> None:
    """The split-K partials and sums of squares are float32 even where model code made
    float16 torch's default dtype (in float16 the sums of squares of large rows overflow and
    the output came out zero)."""
    script = """
import torch
from pathlib import Path
from tests.source_files import import_file
m = import_file(Path("kernels/rmsnorm_linear_swiglu/triton_rmsnorm_gemm_swiglu.py"))
task = import_file(Path("kernels/rmsnorm_linear_swiglu/task.py"))
gen = torch.Generator().manual_seed(0)
x = torch.randn(3, 200, generator=gen) * 50
g, w = torch.randn(200, generator=gen), torch.randn(80, 200, generator=gen) / 14
torch.set_default_dtype(torch.float16)
got = m.kernel(x, g, w, block_n=16, block_k=64, split_k=4)
want = task.reference(x.double(), g.double(), w.double())
print(float((got.double() - want).norm() / want.norm()))
"""
    assert float(run_interpreted(script)) < 1e-5


GLUON = "gluon_rmsnorm_gemm_swiglu.py"


@pytest.mark.gpu
def test_the_gluon_candidate_matches_the_reference_on_gpu(task) -> None:
    """At every task shape, at each of GLUON_X_G_EVALUATED's configurations."""
    ev = gpu_evaluate(task, [(GLUON, params) for params in GLUON_X_G_EVALUATED])
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


def test_the_gluon_candidate_runs_on_the_gpu_only(task) -> None:
    assert GLUON in task.candidates["cuda"]
    assert GLUON not in task.candidates["cpu"]


def test_the_gluon_candidate_refuses_what_it_cannot_run_naming_why(task) -> None:
    """bf16 or fp16 only, K a multiple of 8 (TMA's strides), a ring and a slice of x g that fit
    shared memory, on an sm_90 GPU: anything else is refused before any launch, pointing to the
    Triton kernel."""
    kernel = candidate_module(task, GLUON).kernel

    def inputs(k: int, dtype=torch.bfloat16):
        return (
            torch.zeros(2, k, dtype=dtype),
            torch.ones(k, dtype=dtype),
            torch.zeros(128, k, dtype=dtype),
        )

    cases = [
        (inputs(128, torch.float32), {}, "bf16 or fp16"),
        (inputs(100), {}, "k 100: a multiple of 8"),
        (inputs(128), {"block_k": 256}, "block_k 256"),
        (inputs(128), {"num_stages": 1}, "num_stages 1"),
        (inputs(128), {"programs_per_sm": 4}, "programs_per_sm 4: 1, 2 or 3 only"),
        (inputs(4096), {"split_k": 1, "num_stages": 6}, "k 4096 in 1 slices"),
        (inputs(128), {}, "needs an sm_90 GPU"),  # here on the CPU
    ]
    for args, params, why in cases:
        with pytest.raises(ValueError, match=f"{why}.*use triton_rmsnorm_gemm_swiglu.py"):
            kernel(*args, **params)


@pytest.mark.parametrize(("build", "programs"), GLUON_X_G_REGISTER_BUILDS)
def test_the_gluon_kernel_builds_as_a_warpgroup_and_a_loader_warp(task, build, programs) -> None:
    """Built for sm_90 as a warpgroup and a loader warp (assert_gluon_x_g_kernel_builds), W and
    x by TMA, the loader's wait for the kernel before after the ring's first W tiles and the
    warpgroup's after its g (neither is written by a kernel)."""
    module = candidate_module(task, GLUON)
    types = {"y_ptr": "*bf16", "F": "i32"}
    fn = module._rmsnorm_gemm_swiglu
    assert_gluon_x_g_kernel_builds(module, fn, ("w_desc",), types, {}, build, programs)


@pytest.mark.gpu
@pytest.mark.parametrize("late", [False, True])
def test_the_gluon_kernel_waits_for_the_kernel_that_writes_x(task, late) -> None:
    """At 16 rows, launched with programmatic dependent launch right after a kernel that writes
    x late, it reads the new x (W streams early; W and g are never written)."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, GLUON)
    shape = next(s for s in task.shapes("cuda") if s.name == "m16-f14336-k4096")
    x, g, w = task.make_inputs(shape, 7, "cuda")
    want = task.reference(x.double(), g.double(), w.double())
    assert_waits_for_late_inputs(lambda x: module.kernel(x, g, w, late_dependents=late), (x,), want)


@pytest.mark.gpu
def test_the_gluon_kernel_replays_in_a_graph_and_leaves_its_counts_at_zero(task) -> None:
    """Replays of one captured call on new x each give the right outputs, and leave every
    arrival count at 0 (no zero-fill between calls or replays)."""
    module = candidate_module(task, GLUON)
    shape = next(s for s in task.shapes("cuda") if s.name == "m16-f14336-k4096")
    x, g, w = task.make_inputs(shape, 3, "cuda")
    module.kernel(x, g, w, split_k=4)  # the kept counts exist first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = module.kernel(x, g, w, split_k=4)
    for seed in range(3):
        x.copy_(task.make_inputs(shape, 10 + seed, "cuda")[0])
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = task.reference(x.double(), g.double(), w.double())
        torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)
    assert all(int(c.abs().sum()) == 0 for c in module._COUNTS[x.device])

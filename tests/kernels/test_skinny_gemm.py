"""The skinny GEMM task: reference, inputs, shapes, and its shipped candidates (CPU; Triton under
the interpreter; the CuPy kernel compiled by NVRTC here and run only on a GPU)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from loop.guards import check_source
from loop.tasks import load_task
from tests.kernels.candidate_tools import evaluate_on_cpu, mutated
from tests.kernels.task_checks import (
    assert_cuda_compiles,
    assert_splitk_launches_compile,
    candidate_module,
)

TRITON_PARAMS = {"block_n": 16, "block_k": 32, "split_k": 2, "num_stages": 1}


@pytest.fixture(scope="module")
def task():
    return load_task("skinny_gemm")


def test_reference_is_x_times_w_transposed(task) -> None:
    shape = task.shapes("cpu")[1]
    x, w = task.make_inputs(shape, 3, "cpu")
    got = task.reference(x.double(), w.double()).numpy()
    want = np.einsum("mk,nk->mn", x.double().numpy(), w.double().numpy())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_inputs_are_seeded_and_outputs_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[1], c[1])
    assert 0.3 < float(task.reference(*(t.double() for t in a)).abs().mean()) < 3.0


def test_gpu_shapes_are_real_projections_at_decode_and_batch_rows(task) -> None:
    shapes = task.shapes("cuda")
    assert {s.dims["m"] for s in shapes} == {1, 4, 16, 64, 256}
    assert {(7168, 7168), (4096, 14336), (18432, 7168)} <= {
        (s.dims["n"], s.dims["k"]) for s in shapes
    }
    assert {s.dtype for s in shapes} == {"bfloat16"}
    assert task.bucket_key == "m" and all(isinstance(s.dims["m"], int) for s in shapes)


def test_bytes_are_the_weight_read_once_and_flops_2mnk(task) -> None:
    shape = next(s for s in task.shapes("cuda") if s.name == "m16-n7168-k7168")
    assert task.bytes_moved(shape) == 2 * (7168 * 7168 + 16 * 7168 + 16 * 7168)
    assert task.declares_read_write()
    assert task.bytes_read_written(shape) == (2 * (7168 * 7168 + 16 * 7168), 2 * 16 * 7168)
    assert task.flops(shape) == 2 * 16 * 7168 * 7168


def test_peers_include_cublas_and_compile(task) -> None:
    assert {"eager", "cublas", "torch.compile"} <= set(task.peers)


def test_candidates_pass_and_a_wrong_split_k_is_rejected(task, tmp_path) -> None:
    triton_src = task.folder / "triton_skinny_gemm.py"
    specs = {
        "triton": (triton_src, TRITON_PARAMS),
        "no-dot": (triton_src, {"block_n": 32, "block_k": 64, "split_k": 1, "use_dot": False}),
        "torch": (task.folder / "torch_skinny_gemm.py", {"chunk_n": 16}),
        # Every split reads the first slice of k: right only when split_k is 1.
        "bug": (
            mutated(triton_src, "k_start = pid_s * k_per_split", "k_start = 0", tmp_path / "b.py"),
            TRITON_PARAMS,
        ),
        "calls-cublas": (mutated_matmul(tmp_path), {}),
    }
    ev = evaluate_on_cpu(task, specs)
    for label in ("triton", "no-dot", "torch"):
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 1e-5
    assert [r.code for r in ev.by_label("bug").reasons] == ["mismatch"]
    assert "calls-reference" in {r.code for r in ev.by_label("calls-cublas").reasons}


def mutated_matmul(tmp_path):
    path = tmp_path / "calls_matmul.py"
    path.write_text(
        "import torch\nLANGUAGE = 'torch'\n\ndef kernel(x, w):\n    return torch.matmul(x, w.t())\n"
    )
    return path


def test_cupy_candidate_shows_raw_cuda_and_compiles_for_hopper(task) -> None:
    source = (task.folder / "cupy_gemv.py").read_text()
    report = check_source(source, "cupy_gemv.py", task.module.FORBIDDEN_OPS)
    assert report.language == "cupy" and report.reasons == []
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    cuda_source = source.split('_SOURCE = r"""')[1].split('"""')[0]
    for vec8 in (0, 1):
        try:
            prog = nvrtc.createProgram(cuda_source, "gemv.cu", [], [])
        except Exception as exc:  # no NVRTC library on this machine
            pytest.skip(f"NVRTC unavailable: {exc}")
        opts = [
            "-std=c++17",
            "-DROWS=4",
            "-DUNROLL=4",
            f"-DVEC8={vec8}",
            "--gpu-architecture=compute_90",
        ]
        nvrtc.compileProgram(prog, opts)
        assert b"gemv_bf16" in nvrtc.getPTX(prog)


def test_the_split_k_gemv_plans_warps_for_the_vectors_each_lane_holds(task) -> None:
    module = candidate_module(task, "cupy_gemv_splitk.py")
    # K = 4096 is 512 vectors: four warps of 32 lanes give each lane four.
    assert module.plan(4096, 4, 2) == (4, 4)
    # K = 18432 wants 18 warps at four a lane; with four outputs a block only eight fit (32
    # warps a block), so each lane holds nine.
    assert module.plan(18432, 4, 1) == (18, 4)
    assert module.plan(18432, 4, 4) == (8, 9)
    # Every vector is some lane's.
    for k in (8, 4096, 14336, 28672):
        k_warps, vectors = module.plan(k, 8, 2)
        assert 32 * k_warps * vectors >= k // 8
    with pytest.raises(ValueError, match="vectors per lane"):
        module.plan(32 * 32 * 8 * (module.MAX_VECTORS_PER_LANE + 1), 2, 1)


def test_the_split_k_gemv_compiles_at_every_launch_of_the_gpu_shapes(task) -> None:
    assert_splitk_launches_compile(task, "cupy_gemv_splitk.py")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "candidate, params",
    [
        ("triton_skinny_gemm.py", {}),
        ("triton_skinny_gemm.py", {"block_m": 64, "split_k": 1, "block_n": 128, "block_k": 64}),
        ("cupy_gemv.py", {}),
        ("cupy_gemv.py", {"rows": 16, "unroll": 2}),
        ("cupy_gemv_splitk.py", {}),
        ("cupy_gemv_splitk.py", {"per_lane": 16, "n_per_block": 1, "rows": 1}),
        ("cupy_gemv_splitk.py", {"per_lane": 2, "n_per_block": 4, "rows": 2}),
        ("cupy_gemv_mma.py", {}),
        ("cupy_gemv_mma.py", {"k_warps": 16, "n_tiles": 2, "unroll": 4}),
        ("cupy_gemv_mma.py", {"k_warps": 4, "n_tiles": 4, "unroll": 1}),
    ],
)
def test_gpu_candidates_match_the_reference(task, candidate, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    ev = evaluate(task, [CandidateSpec(task.folder / candidate, params)], "cuda")
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons


def test_the_mma_gemv_compiles_at_every_launch(task) -> None:
    """Every PARAMS point it does not refuse, for both halves of x's rows, on sm_90 and sm_80;
    the refused ones are those whose partial tiles outgrow its shared memory."""
    module = candidate_module(task, "cupy_gemv_mma.py")
    space = module.PARAMS
    built = 0
    for k_warps, n_tiles, unroll in itertools.product(
        space["k_warps"], space["n_tiles"], space["unroll"]
    ):
        if k_warps * n_tiles > module.MAX_WARP_TILES:
            continue
        for arch, rows in itertools.product(("sm_90", "sm_80"), (8, 16)):
            options = [f"-arch={arch}", *module.compile_options(k_warps, n_tiles, unroll, rows)]
            assert_cuda_compiles(module.SOURCE, options, f"{arch} {options}")
            built += 1
    assert built == 4 * (len(space["k_warps"]) * len(space["n_tiles"]) * len(space["unroll"]) - 3)


@pytest.mark.gpu
@pytest.mark.parametrize("params", [{}, {"k_warps": 4, "n_tiles": 2, "unroll": 4}])
def test_the_mma_gemv_on_ragged_shapes(task, params) -> None:
    """Rows that leave x's halves partly empty or run past 16, outputs that leave the last tile
    short, and a K that ends in a partial 32-wide chunk."""
    module = candidate_module(task, "cupy_gemv_mma.py")
    gen = torch.Generator(device="cuda").manual_seed(5)
    for m, n, k in [(1, 64, 64), (5, 1000, 4104), (8, 48, 256), (9, 4096, 4096), (16, 17, 8),
                    (33, 200, 1032)]:  # fmt: skip
        x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
        w = torch.randn(n, k, generator=gen, device="cuda").mul_(k**-0.5).bfloat16()
        got = module.kernel(x, w, **params).double()
        want = x.double() @ w.double().t()
        torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2, msg=f"m{m} n{n} k{k}")
    with pytest.raises(ValueError, match="at most"):
        module.kernel(x, w, k_warps=16, n_tiles=4)

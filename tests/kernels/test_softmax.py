"""The vocabulary softmax task: reference, inputs, shapes, its shipped candidates on the CPU
(Triton under the interpreter, each of its three paths) against a wrong kernel, the CLI door, and
on the GPU the Triton and CuPy candidates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from appliance.cli import main
from loop.tasks import load_task
from tests.kernels.task_checks import (
    EDGE_COLUMNS,
    assert_cuda_compiles,
    assert_resident_launches_compile,
    assert_resident_plan,
    assert_shipped_accepted,
    assert_wrong_rejected,
    candidate_module,
    edge_rows,
    evaluate_with_wrong,
    gpu_evaluate,
)

# Normalises over the first 1024 columns only: right on small rows, wrong on a vocabulary.
WRONG = """
import torch
LANGUAGE = "torch"
def kernel(x):
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    return (e / e[:, :1024].sum(-1, keepdim=True)).to(x.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("softmax")


def test_reference_matches_the_formula(task) -> None:
    (x,) = task.make_inputs(task.shapes("cpu")[0], 3, "cpu")
    got = task.reference(x.double()).numpy()
    xn = x.double().numpy()
    want = np.exp(xn) / np.exp(xn).sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-12)


def test_inputs_are_seeded_with_peaked_rows(task) -> None:
    shape = task.shapes("cpu")[-1]
    (a,), (b,), (c,) = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    probs = task.reference(a.double())
    assert float(probs[0].max()) > 0.5 > float(probs[1].max())


def test_gpu_shapes_and_traffic(task) -> None:
    shapes = task.shapes("cuda")
    assert {s.dtype for s in shapes} == {"bfloat16"}
    assert {s.dims["vocab"] for s in shapes} >= {32000, 128256}
    assert min(s.dims["rows"] for s in shapes) == 1
    big = next(s for s in shapes if s.name == "prefill-8192x128256")
    assert task.bytes_moved(big) == 2 * 2 * 8192 * 128256


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [
            ("torch_softmax.py", {"chunk_rows": 16}),
            ("triton_softmax.py", {"single_pass_max": 16384, "row_warps": 8}),  # whole rows
            ("triton_softmax.py", {"block": 2048, "single_pass_max": 0, "split_below": 0}),
            ("triton_softmax.py", {"block": 2048, "single_pass_max": 0, "split_below": 64}),
        ],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


def test_verify_door_accepts_the_cpu_candidate(task) -> None:
    result = CliRunner().invoke(
        main, ["verify", "softmax", "torch_softmax.py", "--device", "cpu", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verdict"] == "accepted"
    assert set(data["shapes"]) == {s.name for s in task.shapes("cpu")}


@pytest.mark.gpu
def test_shipped_candidates_on_gpu(task) -> None:
    pytest.importorskip("cupy")
    ev = gpu_evaluate(
        task,
        [
            ("triton_softmax.py", {}),
            ("cupy_softmax.py", {}),
            ("cupy_softmax.py", {"cache_kb": 0, "threads": 256, "unroll": 1}),
            ("cupy_softmax.py", {"cluster": 4, "threads": 512, "unroll": 2}),
            ("cupy_softmax.py", {"cluster": 8, "threads": 1024, "unroll": 4, "cache_kb": 96}),
            ("cupy_softmax.py", {"cluster": 2, "threads": 256, "unroll": 1, "cache_kb": 96}),
            ("cupy_softmax_resident.py", {}),
            ("cupy_softmax_resident.py", {"threads": 256, "slice_kb": 16}),
            ("cupy_softmax_resident.py", {"threads": 1024, "slice_kb": 128}),
            ("cupy_softmax_resident.py", {"threads": 256, "slice_kb": 32, "stages": 1}),
            (
                "cupy_softmax_resident.py",
                {"threads": 256, "slice_kb": 32, "stages": 2, "rows_per_cluster": 2},
            ),
            (
                "cupy_softmax_resident.py",
                {"threads": 512, "slice_kb": 64, "stages": 2, "rows_per_cluster": 16},
            ),
            ("torch_softmax.py", {}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.params, verdict.reasons)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "threads,slice_kb,stages", [(256, 8, 0), (512, 16, 0), (1024, 64, 0), (256, 64, 1)]
)
def test_resident_softmax_on_edge_rows(task, threads, slice_kb, stages) -> None:
    pytest.importorskip("cupy")
    module = candidate_module(task, "cupy_softmax_resident.py")
    for cols in EDGE_COLUMNS:
        x = edge_rows(cols).cuda()
        got = module.kernel(x, threads, slice_kb, stages, 2).double()
        want = torch.softmax(x.double(), dim=-1)
        # Absolute slack below the rows' small probabilities, so a zeroed row fails.
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-2)
        torch.testing.assert_close(got.sum(-1), torch.ones_like(got[:, 0]), atol=1e-2, rtol=0)


def test_the_cuda_source_compiles_for_ampere_and_hopper(task) -> None:
    """The CUDA source (inline PTX for the cluster barrier and distributed shared memory
    included) goes through NVRTC and ptxas at each compile-time parameter: for sm_80 without
    clusters, for sm_90 with each cluster size. No GPU is needed, so a typo costs no device
    time; running it is the GPU test above."""
    module = candidate_module(task, "cupy_softmax.py")
    builds = [("sm_80", unroll, 1) for unroll in module.PARAMS["unroll"]]
    builds += [
        ("sm_90", unroll, cluster)
        for cluster in module.PARAMS["cluster"]
        for unroll in module.PARAMS["unroll"]
    ]
    for arch, unroll, cluster in builds:
        assert_cuda_compiles(
            module.SOURCE,
            [f"-arch={arch}", *module.compile_options(unroll, cluster)],
            f"{arch} unroll={unroll} cluster={cluster}",
        )


def test_the_resident_plan_takes_the_smallest_cluster_that_fits_the_slice(task) -> None:
    assert_resident_plan(candidate_module(task, "cupy_softmax_resident.py"))


def test_prefetching_stages_take_shared_memory_and_are_refused_past_its_size(task) -> None:
    module = candidate_module(task, "cupy_softmax_resident.py")
    # 128256 columns over 8 blocks: 2004-vector slices; two prefetched slices take 2 x 31.3 KiB.
    launch = module.plan(16032, 256, 32, 2)
    assert launch == module.Launch(8, 2004, 8, 2)
    assert launch.shared_bytes == 2 * 2004 * 16
    assert module.plan(16032, 256, 32).shared_bytes == 0
    # One block holding a 62.5 KiB row: four prefetched rows need 250 KiB, more than 226 KiB.
    assert module.plan(4000, 512, 64, 3).shared_bytes == 3 * 4000 * 16
    with pytest.raises(ValueError, match="shared memory"):
        module.plan(4000, 512, 64, 4)


def test_the_resident_source_compiles_at_every_launch_of_the_gpu_shapes(task) -> None:
    assert_resident_launches_compile(task, "cupy_softmax_resident.py")

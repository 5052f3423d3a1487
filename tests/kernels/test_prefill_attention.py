"""The causal prefill attention task: reference (chunked), inputs, shapes, and its shipped
candidates (CPU; Triton under the interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import evaluate_on_cpu, mutated
from tests.kernels.task_checks import candidate_module, run_in_child

TRITON_PARAMS = {"block_m": 16, "block_n": 16, "num_stages": 1}


@pytest.fixture(scope="module")
def task():
    return load_task("prefill_attention")


def _dense(q, k, v) -> np.ndarray:
    q_len, kv_len = q.shape[2], k.shape[2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[3])
    rows = np.arange(q_len)[:, None] + kv_len - q_len
    s = np.where(np.arange(kv_len)[None, :] > rows, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


@pytest.mark.parametrize("budget", [1 << 27, 40])
def test_reference_is_bottom_right_causal_attention_at_any_chunking(
    task, monkeypatch, budget
) -> None:
    monkeypatch.setattr(task.module, "REFERENCE_BUDGET", budget)
    for shape in task.shapes("cpu"):
        inputs = [t.double() for t in task.make_inputs(shape, 3, "cpu")]
        got = task.reference(*inputs).numpy()
        np.testing.assert_allclose(
            got, _dense(*(t.numpy() for t in inputs)), rtol=1e-10, atol=1e-12
        )


def test_inputs_are_seeded_and_outputs_of_order_one(task) -> None:
    shape = task.shapes("cpu")[0]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert 0.1 < float(task.reference(*(t.double() for t in a)).abs().mean()) < 2.0


def test_gpu_shapes_span_1k_to_64k_and_a_chunk_of_128k(task) -> None:
    shapes = task.shapes("cuda")
    full = {s.dims["q_len"] for s in shapes if s.dims["q_len"] == s.dims["kv_len"]}
    assert min(full) == 1024 and max(full) == 65536
    assert max(s.dims["kv_len"] for s in shapes) >= 131072
    assert {(s.dims["heads"], s.dims["head_dim"], s.dtype) for s in shapes} == {
        (32, 128, "bfloat16")
    }


def test_flops_count_only_the_causal_half(task) -> None:
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-q65536-kv65536")
    assert task.flops(shape) == 4 * 32 * 128 * (65536 * 65537 // 2)
    chunk = next(s for s in task.shapes("cuda") if s.dims["q_len"] < s.dims["kv_len"])
    q, kv = chunk.dims["q_len"], chunk.dims["kv_len"]
    assert task.flops(chunk) == 4 * 32 * 128 * (q * (kv - q) + q * (q + 1) // 2)


def test_bytes_are_q_k_v_read_once_and_the_output_written(task) -> None:
    shape = next(s for s in task.shapes("cuda") if s.dims["q_len"] < s.dims["kv_len"])
    per_token = 2 * 32 * 128
    q, kv = shape.dims["q_len"], shape.dims["kv_len"]
    assert task.bytes_read_written(shape) == (per_token * (q + 2 * kv), per_token * q)
    assert task.bytes_moved(shape) == per_token * (2 * q + 2 * kv)


def test_gpu_only_peers_are_left_out_on_the_cpu(task) -> None:
    on_cpu = task.default_peers("cpu")
    assert "sdpa-cudnn" not in on_cpu and "flash-attn" not in on_cpu
    assert {"eager", "sdpa-flash"} <= set(on_cpu)  # SDPA's flash backend has a CPU kernel
    assert {"eager", "sdpa-flash", "sdpa-cudnn"} <= set(task.default_peers("cuda"))
    shape = task.shapes("cpu")[-1]
    inputs = task.make_inputs(shape, 2, "cpu")
    want = task.reference(*(t.double() for t in inputs))
    got = task.peers["sdpa-flash"](*inputs).double()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_candidates_pass_and_a_missing_causal_mask_is_rejected(task, tmp_path) -> None:
    triton_src = task.folder / "triton_prefill_attention.py"
    bug = mutated(
        triton_src,
        "visible = (rn[None, :] <= rm[:, None] + offset) & (rn[None, :] < kv_len)",
        "visible = rn[None, :] < kv_len",
        tmp_path / "b.py",
    )
    # Both loads at three tile shapes (a query tile taller than some shapes' rows among them).
    triton_specs = {
        f"{loads}-m{m}-n{n}": (
            triton_src,
            {"block_m": m, "block_n": n, "num_stages": 1, "loads": loads},
        )
        for loads in ("descriptor", "pointer")
        for m, n in ((16, 16), (32, 16), (16, 32))
    }
    specs = {
        **triton_specs,
        "torch": (task.folder / "torch_prefill_attention.py", {"chunk": 64}),
        "bug": (bug, TRITON_PARAMS),
    }
    ev = evaluate_on_cpu(task, specs)
    for label in (*triton_specs, "torch"):
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5
    assert [r.code for r in ev.by_label("bug").reasons] == ["mismatch"]


def test_descriptor_loads_refuse_layouts_tma_cannot_address(task) -> None:
    """TMA needs 16-byte aligned rows, strides and base: 2 float32 columns (8-byte rows) and a
    base 4 bytes off are refused before any launch, naming what is wrong and the way out."""
    module = candidate_module(task, "triton_prefill_attention.py")
    narrow = torch.zeros(1, 1, 16, 2)
    with pytest.raises(ValueError, match=r"row stride 8 bytes.*use loads='pointer'"):
        module.kernel(narrow, narrow, narrow, block_m=16, block_n=16)
    shifted = torch.zeros(65)[1:].view(1, 1, 16, 4)
    with pytest.raises(ValueError, match="base address"):
        module.kernel(shifted, shifted, shifted, block_m=16, block_n=16)
    with pytest.raises(ValueError, match="expected one of"):
        module.kernel(narrow, narrow, narrow, loads="tma")


def test_no_queries_give_an_empty_output_with_either_loads(task) -> None:
    module = candidate_module(task, "triton_prefill_attention.py")
    q, kv = torch.zeros(1, 2, 0, 16), torch.ones(1, 2, 8, 16)
    for loads in ("descriptor", "pointer"):
        assert module.kernel(q, kv, kv, loads=loads).shape == (1, 2, 0, 16)


def test_gluon_candidate_refuses_what_it_cannot_run_naming_why(task) -> None:
    """Its kernel takes whole 128-row tiles of contiguous bf16/fp16 heads of 64 or 128 on sm_90;
    anything else is refused before any launch, pointing to the Triton candidate."""
    module = candidate_module(task, "gluon_prefill_attention.py")

    def bf16(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.bfloat16)

    q = bf16(1, 2, 128, 128)
    cases = [
        ((q.float(), q.float(), q.float()), "bf16 or fp16"),
        ((q.transpose(2, 3), q, q), "contiguous"),
        ((q, bf16(1, 2, 128, 64), q), "do not match"),
        ((bf16(1, 2, 128, 96),) * 3, "head_dim 96"),
        ((bf16(1, 2, 64, 128), q, q), "multiples of 128"),
        ((q, q, q), "sm_90 GPU"),  # here on the CPU
    ]
    for inputs, why in cases:
        with pytest.raises(ValueError, match=f"{why}.*triton_prefill_attention.py"):
            module.kernel(*inputs)
    with pytest.raises(ValueError, match="q_len 256 > kv_len 128"):
        module.kernel(bf16(1, 2, 256, 128), q, q)
    with pytest.raises(ValueError, match="multiples of 128, 64"):
        module.kernel(q, bf16(1, 2, 160, 128), bf16(1, 2, 160, 128), block_n=64)
    with pytest.raises(ValueError, match="4-D"):
        module.kernel(q[0], q[0], q[0])
    with pytest.raises(
        ValueError, match=r"block_n 128 at 4 stages needs \d+ bytes of shared memory"
    ):
        module.kernel(q, q, q, block_n=128, num_stages=4)
    shifted = torch.zeros(q.numel() + 1, dtype=torch.bfloat16)[1:].view(q.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        module.kernel(shifted, shifted, shifted)
    with pytest.raises(ValueError, match="num_stages 1"):
        module.kernel(q, q, q, num_stages=1)
    with pytest.raises(ValueError, match="pairs need 64-key tiles"):
        module.kernel(q, q, q, pairs=True)
    wide = torch.empty(1, 65536, 128, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="batch x heads 65536 above the grid's 65535"):
        module.kernel(wide, wide, wide)


# What the task's GPU shapes (head_dim 128, bf16, causal offsets a multiple of 128) leave out:
# head_dim 64, fp16, and a causal offset of 64 with 64-key tiles, where the first warpgroup's
# last tile is masked whole. In a child process with a time limit: a hang fails the test.
GLUON_PATHS = """
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import assert_within_tolerance, candidate_module

task = load_task("prefill_attention")
module = candidate_module(task, "gluon_prefill_attention.py")
cases = [
    (2, 3, 128, 192, 64, torch.float16, {"block_n": 64}),
    (1, 2, 256, 256, 128, torch.bfloat16, {"block_n": 64, "num_stages": 3}),
    (1, 2, 384, 640, 128, torch.float16, {"num_stages": 3}),
    (2, 2, 256, 384, 64, torch.bfloat16, {"num_stages": 4}),
    (1, 1, 128, 128, 128, torch.bfloat16, {}),
    (1, 2, 512, 1024, 128, torch.bfloat16, {"block_n": 64, "num_stages": 3, "pairs": True}),
    (2, 3, 384, 448, 64, torch.float16, {"block_n": 64, "pairs": True}),
]
gen = torch.Generator(device="cuda").manual_seed(0)
for b, h, q_len, kv_len, d, dtype, params in cases:
    q, k, v = (
        torch.randn(b, h, n, d, generator=gen, device="cuda").to(dtype)
        for n in (q_len, kv_len, kv_len)
    )
    got = module.kernel(q, k, v, **params).double()
    want = task.reference(q.double(), k.double(), v.double())
    assert_within_tolerance(task, got, want, dtype, b, h, q_len, kv_len, d, dtype, params)
"""


@pytest.mark.gpu
def test_gluon_candidate_paths_the_task_shapes_leave_out_on_gpu() -> None:
    run_in_child(GLUON_PATHS)


def test_gluon_candidate_runs_on_the_gpu_only(task) -> None:
    assert "gluon_prefill_attention.py" in task.candidates["cuda"]
    assert "gluon_prefill_attention.py" not in task.candidates["cpu"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"num_stages": 3},
        {"block_n": 64, "num_stages": 4},
        {"block_n": 64, "num_stages": 4, "pairs": True},
    ],
)
def test_gluon_candidate_matches_the_reference_on_gpu(task, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "gluon_prefill_attention.py", params)
    ev = evaluate(
        task, [spec], "cuda", shapes=["b8-q1024-kv1024", "b1-q8192-kv8192", "b1-q8192-kv131072"]
    )
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"block_m": 64, "block_n": 64, "num_warps": 4},
        {"loads": "pointer", "block_n": 64},
        {"block_n": 64, "num_stages": 2},
        {"block_m": 256, "block_n": 64, "num_warps": 16},
        {"block_n": 64, "num_stages": 2, "max_registers": 128},
        {"num_warps": 4, "block_n": 64, "num_stages": 2},
    ],
)
def test_triton_candidate_matches_the_reference_on_gpu(task, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "triton_prefill_attention.py", params)
    ev = evaluate(
        task, [spec], "cuda", shapes=["b8-q1024-kv1024", "b1-q8192-kv8192", "b1-q8192-kv131072"]
    )
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons

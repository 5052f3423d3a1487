"""The GQA decode task: reference, inputs, shapes, and its shipped candidates (CPU; Triton under
the interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import cli_verify, evaluate_on_cpu, mutated
from tests.kernels.task_checks import (
    assert_weights_stream_before_the_wait,
    candidate_module,
    hopper_ptx,
)

TRITON_PARAMS = {"block_n": 16, "split_tokens": 32, "num_stages": 1}


@pytest.fixture(scope="module")
def task():
    return load_task("gqa_decode")


def test_reference_is_softmax_attention_with_shared_kv_heads(task) -> None:
    shape = task.shapes("cpu")[1]
    q, k, v = (t.double().numpy() for t in task.make_inputs(shape, 3, "cpu"))
    got = task.reference(*(torch.from_numpy(t) for t in (q, k, v))).numpy()
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            kv = h // group
            s = k[b, kv] @ q[b, h] / math.sqrt(q.shape[2])
            p = np.exp(s - s.max())
            np.testing.assert_allclose(got[b, h], p @ v[b, kv] / p.sum(), rtol=1e-12, atol=1e-12)


def test_inputs_are_seeded_and_outputs_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[1], c[1])
    assert 0.1 < float(task.reference(*(t.double() for t in a)).abs().mean()) < 2.0


def test_gpu_shapes_reach_128k_with_32_query_heads_on_8(task) -> None:
    shapes = task.shapes("cuda")
    assert max(s.dims["kv_len"] for s in shapes) >= 131072
    assert min(s.dims["batch"] for s in shapes) == 1
    assert {(s.dims["q_heads"], s.dims["kv_heads"], s.dims["head_dim"]) for s in shapes} == {
        (32, 8, 128)
    }
    assert {s.dtype for s in shapes} == {"bfloat16"}


def test_bytes_count_the_cache_once_not_expanded(task) -> None:
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv131072")
    cache = 2 * 8 * 131072 * 128 * 2
    assert task.bytes_moved(shape) == cache + 2 * 2 * 32 * 128
    assert task.bytes_read_written(shape) == (cache + 2 * 32 * 128, 2 * 32 * 128)
    assert task.flops(shape) == 4 * 32 * 131072 * 128


def test_peers_include_the_expanded_sdpa_path(task) -> None:
    assert {"eager", "torch.compile"} <= set(task.peers)
    shape = task.shapes("cpu")[0]
    inputs = task.make_inputs(shape, 1, "cpu")
    want = task.reference(*(t.double() for t in inputs))
    for name in ("eager", "sdpa-gqa"):
        if name in task.peers:
            torch.testing.assert_close(
                task.peers[name](*inputs).double(), want, rtol=1e-4, atol=1e-5
            )


def test_flash_attn_is_a_gpu_only_peer(task) -> None:
    assert "flash-attn" not in task.default_peers("cpu")
    assert task.peer_runs_on("flash-attn", "cuda")
    assert task.peer_runs_on("eager", "cpu")


def test_triton_candidate_through_the_cli(task) -> None:
    code, data = cli_verify("gqa_decode", "triton_gqa_decode.py", TRITON_PARAMS)
    assert code == 0, data["reasons"]
    assert len(data["shapes"]) == len(task.shapes("cpu"))


def test_candidates_pass_and_a_wrong_head_mapping_is_rejected(task, tmp_path) -> None:
    triton_src = task.folder / "triton_gqa_decode.py"
    # Query head h paired with KV head h % kv_heads instead of h // group: the classic slip.
    bug = mutated(
        triton_src,
        "(h * GROUP + g)[:, None] * stride_qh",
        "(g * HKV + h)[:, None] * stride_qh",
        tmp_path / "b.py",
    )
    specs = {
        "auto-split-no-dot": (triton_src, {"block_n": 32, "use_dot": False, "num_stages": 1}),
        "defaults": (triton_src, {}),
        "torch": (task.folder / "torch_gqa_decode.py", {"chunk": 1024}),
        "bug": (bug, TRITON_PARAMS),
    }
    ev = evaluate_on_cpu(task, specs)
    for label in ("auto-split-no-dot", "defaults", "torch"):
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5
    assert [r.code for r in ev.by_label("bug").reasons] == ["mismatch"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params", [{}, {"block_n": 128, "split_tokens": 2048, "num_warps": 8}, {"use_dot": False}]
)
def test_triton_candidate_matches_the_reference_on_gpu(task, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "triton_gqa_decode.py", params)
    ev = evaluate(task, [spec], "cuda")
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons


@pytest.mark.gpu
def test_the_triton_candidate_waits_for_the_kernel_that_writes_q_and_the_cache(task) -> None:
    """Launched with programmatic dependent launch right after kernels that write q, k and v
    200 us late, the split kernel still reads the new ones, and the merge the split's parts."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_gqa_decode.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    q, k, v = task.make_inputs(shape, 7, "cuda")
    want = task.reference(q.double(), k.double(), v.double())
    run = lambda q, k, v: module.kernel(q, k, v, split_tokens=256)  # noqa: E731
    assert_waits_for_late_inputs(run, (q, k, v), want)


def test_auto_split_takes_1024_tokens_unless_that_leaves_sms_idle(task) -> None:
    auto = candidate_module(task, "triton_gqa_decode.py").auto_split_tokens
    # 132 SMs (H200), 8 KV heads: the benched shapes all give 132+ programs at 1024 tokens.
    assert auto(1 * 8, 32768, 64, 132, 4) == 1024  # 256 programs
    assert auto(64 * 8, 2048, 64, 132, 4) == 1024
    # Batch 1 at 4096 tokens: 32 programs at 1024; instead 66 splits of 64 tokens (528).
    assert auto(1 * 8, 4096, 64, 132, 4) == 64
    assert auto(1 * 8, 100, 64, 132, 4) == 64  # never a split longer than the cache needs


@pytest.mark.parametrize("num_stages", [1, 3])
def test_both_kernels_wait_for_the_kernel_before_them_before_reading(task, num_stages) -> None:
    """Compiled for sm_90 (no GPU needed), at a pipelined and an unpipelined launch: the split
    and the merge kernels let their dependents launch, and load nothing before
    griddepcontrol.wait (q comes from the kernel before; the cache may too)."""
    module = candidate_module(task, "triton_gqa_decode.py")
    scalars = ("kv_len", "tokens_per_split", "n_splits")
    strides = ("stride_qb", "stride_qh", "stride_kb", "stride_kh", "stride_kn")
    strides += ("stride_vb", "stride_vh", "stride_vn")
    types = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr"), "*bf16")
    types |= dict.fromkeys(("po_ptr", "plse_ptr"), "*fp32")
    types |= dict.fromkeys(scalars + strides, "i32") | {"scale_log2": "fp32"}
    constexprs = {"HKV": 8, "GROUP": 4, "GROUP_PAD": 16, "D": 128, "BLOCK_N": 64}
    constexprs |= {"USE_DOT": True, "PDL": True}
    split = hopper_ptx(module._split_kernel, types, constexprs, 4, num_stages)
    assert_weights_stream_before_the_wait(split, 0)
    types = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "out_ptr": "*bf16", "n_splits": "i32"}
    merge = hopper_ptx(module._merge_kernel, types, {"D": 128, "BLOCK_S": 16, "PDL": True}, 4)
    assert_weights_stream_before_the_wait(merge, 0)

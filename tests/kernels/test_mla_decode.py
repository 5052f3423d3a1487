"""The MLA decode task: reference, inputs, shapes, and its shipped candidates (CPU; Triton under
the interpreter)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import evaluate_on_cpu, mutated
from tests.kernels.task_checks import (
    assert_weights_stream_before_the_wait,
    candidate_module,
    hopper_ptx,
    run_interpreted,
)

TRITON_PARAMS = {"block_h": 16, "block_n": 16, "split_tokens": 32, "num_stages": 1}


@pytest.fixture(scope="module")
def task():
    return load_task("mla_decode")


def test_reference_is_latent_attention_with_a_rope_term(task) -> None:
    shape = task.shapes("cpu")[1]
    qn, qp, c, p = (t.double().numpy() for t in task.make_inputs(shape, 3, "cpu"))
    got = task.reference(*(torch.from_numpy(t) for t in (qn, qp, c, p))).numpy()
    for b in range(qn.shape[0]):
        s = (qn[b] @ c[b].T + qp[b] @ p[b].T) / math.sqrt(192)
        w = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(got[b], w / w.sum(-1, keepdims=True) @ c[b], rtol=1e-12)


def test_inputs_are_seeded_and_outputs_of_order_one(task) -> None:
    shape = task.shapes("cpu")[-1]
    a, b, c = (task.make_inputs(shape, s, "cpu") for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[2], c[2])
    assert 0.1 < float(task.reference(*(t.double() for t in a)).abs().mean()) < 2.0


def test_gpu_shapes_are_deepseek_v3_up_to_128k(task) -> None:
    shapes = task.shapes("cuda")
    assert {(s.dims["heads"], s.dims["kv_lora_rank"], s.dims["rope_dim"]) for s in shapes} == {
        (128, 512, 64)
    }
    assert max(s.dims["kv_len"] for s in shapes) >= 131072
    shape = next(s for s in shapes if s.name == "b1-kv131072")
    assert task.bytes_moved(shape) == 2 * (131072 * 576 + 128 * (2 * 512 + 64))
    assert task.declares_read_write()
    assert task.bytes_read_written(shape) == (2 * (131072 * 576 + 128 * 576), 2 * 128 * 512)


def test_peers_agree_with_the_reference_on_cpu(task) -> None:
    inputs = task.make_inputs(task.shapes("cpu")[0], 1, "cpu")
    want = task.reference(*(t.double() for t in inputs))
    for name in ("eager", "sdpa-mqa"):
        got = task.peers[name](*inputs).double()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_candidates_pass_and_a_dropped_rope_term_is_rejected(task, tmp_path) -> None:
    triton_src = task.folder / "triton_mla_decode.py"
    bug = mutated(
        triton_src,
        's = tl.dot(qp, tl.trans(kp), s, input_precision="ieee")',
        "s = s + 0.0",
        tmp_path / "b.py",
    )
    # with tokens as rows, the weights' running sum taken over heads, not tokens
    bug_t = mutated(
        triton_src,
        "l_i = l_i * alpha + tl.sum(prob, axis=0)",
        "l_i = l_i * alpha + tl.sum(prob, axis=1)",
        tmp_path / "t.py",
    )
    specs = {
        "triton": (triton_src, TRITON_PARAMS),
        "auto-split": (triton_src, {"block_h": 16, "block_n": 32, "num_stages": 1}),
        "defaults": (triton_src, {}),
        "tokens-as-rows": (triton_src, TRITON_PARAMS | {"tokens_as_rows": True}),
        "tokens-as-rows-auto": (triton_src, {"block_h": 16, "block_n": 32, "tokens_as_rows": True}),
        "torch": (task.folder / "torch_mla_decode.py", {"chunk": 1024}),
        "bug": (bug, TRITON_PARAMS),
        "bug-tokens-as-rows": (bug_t, TRITON_PARAMS | {"tokens_as_rows": True}),
    }
    ev = evaluate_on_cpu(task, specs)
    for label in (
        "triton",
        "auto-split",
        "defaults",
        "tokens-as-rows",
        "tokens-as-rows-auto",
        "torch",
    ):
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5
    assert [r.code for r in ev.by_label("bug").reasons] == ["mismatch"]
    assert [r.code for r in ev.by_label("bug-tokens-as-rows").reasons] == ["mismatch"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"block_h": 16, "block_n": 64, "num_warps": 4},
        # batch 1's table entry at 4096 tokens: 16 splits merged in one pass
        {"block_h": 16, "block_n": 128, "num_warps": 4, "num_stages": 2},
        {"block_h": 64, "block_n": 32, "num_warps": 8, "tokens_as_rows": True},
        {"block_h": 16, "block_n": 64, "num_warps": 8, "tokens_as_rows": True},
    ],
)
def test_triton_candidate_matches_the_reference_on_gpu(task, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "triton_mla_decode.py", params)
    ev = evaluate(task, [spec], "cuda")
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons


def test_splits_fill_one_wave_without_a_second(task) -> None:
    split_count = candidate_module(task, "triton_mla_decode.py").split_count
    # 132 SMs (H200), 128 heads in 2 blocks of 64: programs = batch * 2 * splits <= 132.
    assert split_count(16 * 2, 128, 132, 1) == 4
    assert split_count(1 * 2, 2048, 132, 1) == 66
    assert split_count(64 * 2, 64, 132, 1) == 1
    assert split_count(4 * 2, 2048, 132, 2) == 33
    assert split_count(1 * 2, 3, 132, 1) == 3  # never more splits than token blocks


@pytest.mark.gpu
def test_both_kernels_wait_for_the_kernel_that_writes_their_inputs(task) -> None:
    """Launched with programmatic dependent launch right after kernels that write q_nope, q_pe
    and either cache 2 ms late, the split kernel reads the new ones (and the merge, launched
    early behind it, the split's partials), at batch 1's table entry at 4096 tokens."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_mla_decode.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    inputs = task.make_inputs(shape, 7, "cuda")
    want = task.reference(*(t.double() for t in inputs))
    params = {"block_h": 16, "block_n": 128, "num_warps": 4, "num_stages": 2}
    assert_waits_for_late_inputs(lambda *t: module.kernel(*t, **params), tuple(inputs), want)


def test_both_kernels_wait_before_reading_and_then_let_the_next_launch(task) -> None:
    """Compiled for sm_90 (no GPU needed): the split kernel and the merge (in one pass and in
    several) load and store nothing before griddepcontrol.wait and let their dependents launch
    only after it."""
    module = candidate_module(task, "triton_mla_decode.py")
    names = ("H", "kv_len", "tokens_per_split", "n_splits", "stride_qnb", "stride_qnh")
    names += ("stride_qpb", "stride_qph", "stride_cb", "stride_cn", "stride_pb", "stride_pn")
    types = dict.fromkeys(("qn_ptr", "qp_ptr", "c_ptr", "p_ptr"), "*bf16")
    types |= dict.fromkeys(("po_ptr", "plse_ptr"), "*fp32")
    types |= dict.fromkeys(names, "i32") | {"scale_log2": "fp32"}
    constexprs = {"R": 512, "P": 64, "BLOCK_H": 16, "BLOCK_N": 64, "PDL": True}
    split = hopper_ptx(module._split_kernel, types, constexprs, 4, 2)
    assert_weights_stream_before_the_wait(split, 0)
    types = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "out_ptr": "*bf16", "n_splits": "i32"}
    for one_pass in (True, False):
        constexprs = {"R": 512, "BLOCK_S": 16, "ONE_PASS": one_pass, "PDL": True}
        assert_weights_stream_before_the_wait(
            hopper_ptx(module._merge_kernel, types, constexprs, 4), 0
        )


# Under the interpreter in a Python of its own: a 1100-token cache cut into 69 splits (the merge
# over two blocks of 64), 35 (one block, one pass) and 1, each against the reference.
MANY_SPLITS = """
import json
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module

task = load_task("mla_decode")
module = candidate_module(task, "triton_mla_decode.py")
gen = torch.Generator().manual_seed(5)
shapes = ((1, 8, 32), (1, 8, 16), (1, 1100, 32), (1, 1100, 16))
inputs = [torch.randn(shape, generator=gen) for shape in shapes]
want = task.reference(*(t.double() for t in inputs))
errors = {}
for tokens in (16, 32, 1100):
    got = module.kernel(*inputs, block_h=16, block_n=16, split_tokens=tokens, num_stages=1)
    errors[tokens] = float((got.double() - want).abs().max())
print(json.dumps(errors))
"""


def test_the_merge_takes_one_block_of_splits_or_several(task) -> None:
    errors = json.loads(run_interpreted(MANY_SPLITS))
    assert set(errors) == {"16", "32", "1100"}
    assert all(err < 1e-5 for err in errors.values()), errors


def test_an_empty_cache_is_refused_with_a_clear_error(task) -> None:
    module = candidate_module(task, "triton_mla_decode.py")
    q_nope, q_pe, ckv, kpe = task.make_inputs(task.shapes("cpu")[0], 1, "cpu")
    with pytest.raises(ValueError, match="the cache is empty"):
        module.kernel(q_nope, q_pe, ckv[:, :0], kpe[:, :0])

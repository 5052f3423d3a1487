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
    run_in_child,
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


# ----------------------------------------------------------------------- the Gluon candidate


def test_triton_candidate_returns_an_empty_batch_at_once(task) -> None:
    """No sequence or no head: nothing to launch (the split rule divided by zero programs)."""
    kernel = candidate_module(task, "triton_mla_decode.py").kernel
    for b, h in ((0, 128), (2, 0)):
        inputs = [torch.zeros(s) for s in ((b, h, 512), (b, h, 64), (b, 64, 512), (b, 64, 64))]
        out = kernel(*inputs)
        assert out.shape == (b, h, 512) and out.dtype == inputs[0].dtype


def test_gluon_candidate_runs_on_the_gpu_only(task) -> None:
    assert "gluon_mla_decode.py" in task.candidates["cuda"]
    assert "gluon_mla_decode.py" not in task.candidates["cpu"]


def test_gluon_candidate_refuses_what_it_cannot_run_naming_why(task) -> None:
    """Its kernel takes contiguous bf16/fp16 inputs of rank 512 and rope 64, heads in blocks of
    64 and whole cache tiles on sm_90; anything else is refused before any launch, pointing to
    the Triton candidate."""
    module = candidate_module(task, "gluon_mla_decode.py")

    def bf16(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.bfloat16)

    qn, qp, ckv, kpe = bf16(1, 128, 512), bf16(1, 128, 64), bf16(1, 256, 512), bf16(1, 256, 64)
    cases = [
        ((qn.float(), qp.float(), ckv.float(), kpe.float()), "bf16 or fp16"),
        ((qn, qp.half(), ckv, kpe), "one dtype"),
        ((qn, qp, bf16(1, 256, 1024)[:, :, :512], kpe), "contiguous"),
        ((bf16(1, 128, 256), qp, bf16(1, 256, 256), kpe), "rank 512 and rope 64"),
        ((qn, qp, ckv, bf16(1, 192, 64)), "does not match"),
        ((bf16(1, 96, 512), bf16(1, 96, 64), ckv, kpe), "heads 96"),
        ((qn, qp, bf16(1, 200, 512), bf16(1, 200, 64)), "kv_len 200"),
        ((qn, qp, bf16(1, 0, 512), bf16(1, 0, 64)), "kv_len 0"),
        ((qn[0], qp[0], ckv[0], kpe[0]), "3-D"),
        ((qn, qp, ckv, kpe), "sm_90 GPU"),  # here on the CPU
    ]
    for inputs, why in cases:
        with pytest.raises(ValueError, match=f"{why}.*triton_mla_decode.py"):
            module.kernel(*inputs)
    with pytest.raises(ValueError, match="num_stages 1"):
        module.kernel(qn, qp, ckv, kpe, num_stages=1)
    with pytest.raises(ValueError, match=r"block_n 64 at 3 stages needs \d+ bytes"):
        module.kernel(qn, qp, ckv, kpe, num_stages=3)
    shifted = torch.zeros(ckv.numel() + 1, dtype=torch.bfloat16)[1:].view(ckv.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        module.kernel(qn, qp, shifted, kpe)
    with pytest.raises(ValueError, match="eager_values is for the two-warpgroup order"):
        module.kernel(qn, qp, ckv, kpe, eager_values=True, shared_p=True)


def test_gluon_merge_spreads_columns_only_where_rows_leave_sms_idle(task) -> None:
    merge_shape = candidate_module(task, "gluon_mla_decode.py").merge_shape
    assert merge_shape(128, 64, 132) == (128, 64)  # batch 1 at 32k: 512 programs, one step
    assert merge_shape(128, 3, 132) == (128, 4)
    assert merge_shape(16 * 128, 4, 132) == (512, 4)  # batch 16: a program a row
    assert merge_shape(4 * 128, 16, 132) == (512, 16)
    assert merge_shape(4 * 128, 40, 132) == (512, 16)  # 64 x 128 columns' registers at most


def test_gluon_splits_fill_one_wave_without_a_second(task) -> None:
    split_tiles = candidate_module(task, "gluon_mla_decode.py").split_tiles
    # 132 SMs, 128 heads in 2 programs of 64: programs x splits <= 132.
    assert split_tiles(2, 512, 132) == 8  # batch 1 at 32k: 64 splits
    assert split_tiles(2, 3, 132) == 1  # never more splits than tiles
    assert split_tiles(32, 64, 132) == 16  # batch 16 at 4k: 4 splits
    assert split_tiles(128, 64, 132) == 64  # batch 64: one split


# The Gluon file's merge (a Triton kernel) under the interpreter, in a Python of its own: the
# reference cut into 37 splits by hand (partials and their log2-sum-exp), merged 16 a step in
# programs of 32 columns, and 64 a step in programs of 8.
GLUON_MERGE = """
import json, math
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module

task = load_task("mla_decode")
module = candidate_module(task, "gluon_mla_decode.py")
gen = torch.Generator().manual_seed(3)
b, h, n, r, splits = 2, 3, 37 * 4, 32, 37
qn, qp, ckv, kpe = (torch.randn(s, generator=gen, dtype=torch.float64)
                    for s in ((b, h, r), (b, h, 8), (b, n, r), (b, n, 8)))
scores = (qn @ ckv.transpose(1, 2) + qp @ kpe.transpose(1, 2)) / math.sqrt(192)
want = torch.softmax(scores, -1) @ ckv
parts = scores.view(b, h, splits, n // splits) * math.log2(math.e)
lse = torch.logsumexp(parts / math.log2(math.e), -1) * math.log2(math.e)
w = torch.exp2(parts - lse[..., None])
po = torch.einsum("bhst,bstr->bhsr", w, ckv.view(b, splits, n // splits, r))
errors = []
for block_r, block_s in ((32, 16), (8, 64)):  # 3 steps of 16 splits, or one of 64
    out = torch.empty(b, h, r, dtype=torch.float32)
    module._merge_kernel[(b * h, r // block_r)](po.float().contiguous(), lse.float().contiguous(),
                                                out, splits, R=r, BLOCK_R=block_r, BLOCK_S=block_s,
                                                PDL=False)
    errors.append(float((out.double() - want).abs().max()))
print(json.dumps(errors))
"""


def test_gluon_merge_waits_before_reading_and_lets_nothing_launch_early(task) -> None:
    """Compiled for sm_90 (no GPU needed): the Gluon file's merge, launched with programmatic
    dependent launch, loads and stores nothing before griddepcontrol.wait and does not let its
    dependents launch early, in one step of splits and in several."""
    module = candidate_module(task, "gluon_mla_decode.py")
    types = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "out_ptr": "*bf16", "n_splits": "i32"}
    for block_r, block_s in ((128, 64), (512, 16)):
        constexprs = {"R": 512, "BLOCK_R": block_r, "BLOCK_S": block_s, "PDL": True}
        assert_weights_stream_before_the_wait(
            hopper_ptx(module._merge_kernel, types, constexprs, 4), 0, triggers=False
        )


def test_gluon_merge_weights_the_splits_by_their_log_sum_exp(task) -> None:
    errors = json.loads(run_interpreted(GLUON_MERGE))
    assert len(errors) == 2 and max(errors) < 1e-5, errors


# What the task's GPU shapes (bf16, 128 heads, caches of 4k tiles) leave out: fp16, 64 and 192
# heads, one tile, a last split shorter than the others. In a child process with a time limit:
# a hang fails the test.
GLUON_PATHS = """
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import assert_within_tolerance, candidate_module

task = load_task("mla_decode")
module = candidate_module(task, "gluon_mla_decode.py")
cases = [
    (1, 64, 64, torch.bfloat16, {}),
    (2, 192, 320, torch.float16, {"block_n": 32, "num_stages": 4}),
    (3, 128, 4160, torch.bfloat16, {}),
    (1, 128, 8192 + 32, torch.float16, {"block_n": 32, "num_stages": 3}),
    (1, 64, 64, torch.float16, {"eager_values": True}),
    (2, 192, 320, torch.bfloat16, {"block_n": 32, "num_stages": 4, "eager_values": True}),
    (3, 128, 4160, torch.bfloat16, {"eager_values": True}),
    # shared_p: splits of 1 tile (the second warpgroup computes no scores), 2-5 tiles (odd
    # counts end on the first warpgroup's tile), a short last split
    (1, 64, 64, torch.float16, {"shared_p": True}),
    (3, 128, 4160, torch.bfloat16, {"shared_p": True}),
    (3, 128, 4160, torch.float16, {"block_n": 32, "num_stages": 4, "shared_p": True}),
    (1, 128, 8192 + 32, torch.bfloat16, {"block_n": 32, "num_stages": 3, "shared_p": True}),
    (1, 64, 64 * 300, torch.bfloat16, {"block_n": 32, "num_stages": 4, "shared_p": True}),
]
gen = torch.Generator(device="cuda").manual_seed(0)
for b, h, n, dtype, params in cases:
    inputs = [torch.randn(s, generator=gen, device="cuda").to(dtype)
              for s in ((b, h, 512), (b, h, 64), (b, n, 512), (b, n, 64))]
    inputs[0] *= 0.3
    got = module.kernel(*inputs, **params).double()
    want = task.reference(*(t.double() for t in inputs))
    assert_within_tolerance(task, got, want, dtype, b, h, n, dtype, params)
for b, h, params in ((0, 128, {}), (1, 0, {}), (0, 64, {"shared_p": True})):
    inputs = [torch.zeros(s, device="cuda", dtype=torch.bfloat16)
              for s in ((b, h, 512), (b, h, 64), (b, 64, 512), (b, 64, 64))]
    assert module.kernel(*inputs, **params).shape == (b, h, 512)
    print("empty", b, h, params, flush=True)
"""


@pytest.mark.gpu
def test_gluon_candidate_paths_the_task_shapes_leave_out_on_gpu() -> None:
    run_in_child(GLUON_PATHS)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"block_n": 32, "num_stages": 4},
        {"block_n": 32, "num_stages": 2},
        {"eager_values": True},
        {"block_n": 32, "num_stages": 4, "eager_values": True},
        {"shared_p": True},
        {"block_n": 32, "num_stages": 4, "shared_p": True},
    ],
)
def test_gluon_candidate_matches_the_reference_on_gpu(task, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "gluon_mla_decode.py", params)
    ev = evaluate(task, [spec], "cuda")
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons

"""The GQA decode task: reference, inputs, shapes, and its shipped candidates (CPU; Triton under
the interpreter)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import cli_verify, evaluate_on_cpu, mutated
from tests.kernels.task_checks import (
    assert_partitions_wait_before_memory,
    assert_weights_stream_before_the_wait,
    candidate_module,
    gpu_evaluate,
    hopper_ptx,
    run_in_child,
    run_interpreted,
    ttgir_partitions,
)

TRITON_PARAMS = {"block_n": 16, "split_tokens": 32, "num_stages": 1}
GLUON = "gluon_gqa_decode.py"


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


# Split counts on the CPU shapes (kv_len 19, 64 at batch 2, 200; 4 "SMs"): auto-split for 8
# programs an SM takes 2 (19 tokens in 16-token splits), 1, and 13 (200 in 16-token splits);
# 32 tokens take 1, 2 and 7 (200 again not a multiple); 256 take one split everywhere.
FOLD_SPLITS = {
    "auto": {"split_tokens": 0, "programs_per_sm": 8},
    "32": {"split_tokens": 32},
    "256": {"split_tokens": 256},
}


def test_the_fold_is_accepted_and_a_last_program_off_by_one_is_rejected(task, tmp_path) -> None:
    """merge="fold" at split counts of 1, 2, 7 and 13, with and without tl.dot, as near the
    reference as the merge kernel at each; a copy whose last program waits for one split too
    many merges nothing (and never resets a count)."""
    triton_src = task.folder / "triton_gqa_decode.py"
    bug = mutated(
        triton_src, "if arrived == n_splits - 1:", "if arrived == n_splits:", tmp_path / "b.py"
    )
    specs = {
        f"{merge}-{name}": (triton_src, TRITON_PARAMS | split | {"merge": merge})
        for merge in ("kernel", "fold")
        for name, split in FOLD_SPLITS.items()
    }
    specs["fold-no-dot"] = (triton_src, TRITON_PARAMS | {"merge": "fold", "use_dot": False})
    specs["bug"] = (bug, TRITON_PARAMS | {"merge": "fold"})
    ev = evaluate_on_cpu(task, specs)
    for label in specs.keys() - {"bug"}:
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5, label
    for name in FOLD_SPLITS:
        fold, merged = ev.by_label(f"fold-{name}"), ev.by_label(f"kernel-{name}")
        for shape, seen in fold.shapes.items():
            assert seen.rel_err == pytest.approx(merged.shapes[shape].rel_err, abs=1e-6), shape
    # The output is left as allocated: whatever was in that memory (here, a mismatch).
    bug_codes = {r.code for r in ev.by_label("bug").reasons}
    assert bug_codes, "the off-by-one fold was accepted"
    assert bug_codes <= {"mismatch", "non-finite-output", "constant-output", "crash"}, bug_codes


def test_early_history_is_accepted_and_a_lost_new_slot_is_rejected(task, tmp_path) -> None:
    """early_history at 32-token tiles (each split one tile, holding the cache's last slot at
    every CPU shape) and at 16-token tiles (the loop after the early tile), merged and folded:
    as near the reference as without it. Copies that drop the new slot's key or value read
    after the wait attend to a zero there, and are rejected. (Reading the new slot before the
    wait cannot show on the CPU, which never waits: the GPU race check is for that.)"""
    triton_src = task.folder / "triton_gqa_decode.py"
    bugs = {
        f"bug-{t}": mutated(
            triton_src,
            f"{t}0 = tl.where(new, tl.load({t}_rows0, mask=new, other=0.0), {t}0)",
            f"{t}0 = {t}0",
            tmp_path / f"bug_{t}.py",
        )
        for t in ("k", "v")
    }
    early = {"early_history": True, "num_stages": 1, "split_tokens": 32}
    specs = {
        f"{merge}-{block_n}": (triton_src, early | {"block_n": block_n, "merge": merge})
        for merge in ("kernel", "fold")
        for block_n in (16, 32)
    }
    specs["no-dot"] = (triton_src, early | {"block_n": 16, "use_dot": False})
    # on the CPU the prefetch is left out (the interpreter runs no inline PTX): the same answer
    specs["prefetch"] = (triton_src, early | {"block_n": 16, "prefetch_l2": True})
    specs |= {label: (bug, early | {"block_n": 32}) for label, bug in bugs.items()}
    ev = evaluate_on_cpu(task, specs)
    for label in specs.keys() - bugs.keys():
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5, label
    for label in bugs:
        assert [r.code for r in ev.by_label(label).reasons] == ["mismatch"], label


# Run under the interpreter in a Python of its own (task_checks.run_interpreted): fold calls (CPU
# shape index, seed, params), each against the merge kernel and the reference, and the kept
# counts after each.
FOLD_CALLS = """
import json, sys
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module

task = load_task("gqa_decode")
module = candidate_module(task, "triton_gqa_decode.py")
calls = []
for index, seed, params in json.loads(sys.argv[1]):
    shape = task.shapes("cpu")[index]
    q, k, v = task.make_inputs(shape, seed, "cpu")
    got = module.kernel(q, k, v, **params, merge="fold")
    merged = module.kernel(q, k, v, **params)
    want = task.reference(q.double(), k.double(), v.double())
    calls.append({
        "counters": shape.dims["batch"] * shape.dims["kv_heads"],
        "vs_merge_kernel": float((got - merged).abs().max()),
        "vs_reference": float((got.double() - want).abs().max()),
        "kept": [c.tolist() for c in module._COUNTS[torch.device("cpu")]],
    })
print(json.dumps(calls))
"""


def test_the_fold_twice_and_on_a_larger_batch_leaves_every_count_at_zero(task) -> None:
    """Under the interpreter: the fold gives the merge kernel's answer (to float32 rounding)
    on a call after a call, and on a batch needing more counts than are kept, which grows them;
    every kept count is back at 0 after each call."""
    two_splits = TRITON_PARAMS | FOLD_SPLITS["auto"]  # 19 tokens in 2 splits, 2 counts
    calls = [(0, 1, two_splits), (0, 2, two_splits)]
    calls.append((1, 3, TRITON_PARAMS | FOLD_SPLITS["32"]))  # 64 tokens in 2, 4 counts
    seen = json.loads(run_interpreted(FOLD_CALLS, json.dumps(calls)))
    for call in seen:
        assert call["vs_merge_kernel"] < 1e-6 and call["vs_reference"] < 1e-5, call
        assert len(call["kept"][-1]) >= call["counters"]
        assert all(counts == [0] * len(counts) for counts in call["kept"]), call
    assert [len(call["kept"]) for call in seen] == [1, 1, 2]


MANY_SPLITS = """
import json
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module

task = load_task("gqa_decode")
module = candidate_module(task, "triton_gqa_decode.py")
gen = torch.Generator().manual_seed(5)
q, k, v = (torch.randn(shape, generator=gen) for shape in ((1, 8, 16), (1, 2, 1100, 16), (1, 2, 1100, 16)))
want = task.reference(q.double(), k.double(), v.double())
errors = {}
for merge in ("kernel", "fold"):
    for tokens in (16, 32, 1100):  # 69 splits (two blocks of 64 to merge), 35 (one), 1
        got = module.kernel(q, k, v, block_n=16, split_tokens=tokens, num_stages=1, merge=merge)
        errors[f"{merge}-{tokens}"] = float((got.double() - want).abs().max())
print(json.dumps(errors))
"""


def test_the_merge_takes_one_block_of_splits_or_several(task) -> None:
    """Under the interpreter, on a 1100-token cache: 69 splits (merged over two blocks of 64,
    head by head in the fold), 35 (one block, weights and partials loaded together; the fold
    merges the group's 4 heads at once) and 1 all give the reference, merged and folded."""
    errors = json.loads(run_interpreted(MANY_SPLITS))
    assert set(errors) == {f"{m}-{t}" for m in ("kernel", "fold") for t in (16, 32, 1100)}
    assert all(err < 1e-5 for err in errors.values()), errors


def test_an_unknown_merge_is_refused(task) -> None:
    module = candidate_module(task, "triton_gqa_decode.py")
    q, k, v = task.make_inputs(task.shapes("cpu")[0], 1, "cpu")
    with pytest.raises(ValueError, match="merge"):
        module.kernel(q, k, v, merge="tree")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"block_n": 128, "split_tokens": 2048, "num_warps": 8},
        {"use_dot": False},
        {"merge": "fold"},
        {"merge": "fold", "block_n": 128, "split_tokens": 2048, "num_warps": 8},
        # one warp merges 16 splits at a time: several blocks of them from 32768 tokens
        {"merge": "fold", "split_tokens": 256, "num_warps": 1},
        {"early_history": True, "split_tokens": 256},
        {"early_history": True, "split_tokens": 64},
        {"early_history": True, "block_n": 128, "split_tokens": 2048, "num_warps": 8},
        {"prefetch_l2": True, "split_tokens": 256},
        {"prefetch_l2": True, "early_history": True, "split_tokens": 64},
        {"prefetch_l2": True, "block_n": 128, "split_tokens": 2048, "num_warps": 8},
        {"early_dependents": True, "split_tokens": 256},
        {"early_dependents": True, "early_history": True, "split_tokens": 256},
    ],
)
def test_triton_candidate_matches_the_reference_on_gpu(task, params) -> None:
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "triton_gqa_decode.py", params)
    ev = evaluate(task, [spec], "cuda")
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [{"merge": "kernel"}, {"merge": "fold"}, {"prefetch_l2": True}, {"early_dependents": True}],
)
def test_the_triton_candidate_waits_for_the_kernel_that_writes_q_and_the_cache(
    task, params
) -> None:
    """Launched with programmatic dependent launch right after kernels that write q, k and v
    2 ms late, the split kernel still reads the new ones, and the merge the split's parts (with
    the cache's lines prefetched to L2 before the wait too: a prefetch reads nothing in)."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_gqa_decode.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    q, k, v = task.make_inputs(shape, 7, "cuda")
    want = task.reference(q.double(), k.double(), v.double())
    run = lambda q, k, v: module.kernel(q, k, v, split_tokens=256, **params)  # noqa: E731
    assert_waits_for_late_inputs(run, (q, k, v), want)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "candidate, params",
    [
        ("triton_gqa_decode.py", {"block_n": 64, "split_tokens": 64}),
        (GLUON, {"split_tokens": 64}),
        (GLUON, {"split_tokens": 0, "num_stages": 4}),
    ],
)
def test_early_history_waits_for_q_and_the_new_slot(task, candidate, params) -> None:
    """With early_history, the history may be read before the wait, but q and the cache's last
    slot (the new token's) not: launched right after a kernel that writes q, or the k or v cache
    whose last slot was zero, 2 ms late, the kernel gives the bits it gives on the new inputs
    (and a copy that does not wait sees the old last slot). With one-tile splits of 64 tokens
    the new slot sits in the last split's tile (the Triton kernel's early tile; the Gluon
    kernel's every split but the last loads early); with the Gluon kernel's 16 splits of four
    tiles and a ring of four, every split but the last loads its whole share early, and the last
    three tiles and the new slot's after. Each stale input is checked to change the output, so a
    kernel that read it early could not pass."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, candidate)
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    q, k, v = task.make_inputs(shape, 7, "cuda")

    def without_the_new_slot(t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 4:
            return torch.zeros_like(t)
        old = t.clone()
        old[:, :, -1] = 0
        return old

    def run(q, k, v):
        return module.kernel(q, k, v, early_history=True, **params)

    want = run(q, k, v)
    torch.cuda.synchronize()
    torch.testing.assert_close(
        want.double(), task.reference(q.double(), k.double(), v.double()), atol=2e-2, rtol=2e-2
    )
    for i in range(3):
        stale = [q, k, v]
        stale[i] = without_the_new_slot(stale[i])
        assert not torch.equal(run(*stale), want), f"input {i}: its stale copy changes nothing"
    assert_waits_for_late_inputs(run, (q, k, v), want, stale=without_the_new_slot, exact=True)


@pytest.mark.gpu
def test_the_projection_after_an_early_dependents_merge_reads_the_merged_output(task) -> None:
    """With early_dependents, the output projection after the merge (the Triton GEMV with its
    residual, which streams its weights before its wait) launches while the split kernel runs;
    over 50 steps, each on a new query, the chain gives bit for bit what it gives with the
    merge letting it launch only after its wait."""
    module = candidate_module(task, "triton_gqa_decode.py")
    linear_residual = load_task("linear_residual")
    gemv = candidate_module(linear_residual, "triton_gemv_residual.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    _, k, v = task.make_inputs(shape, 7, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(8)
    w = torch.randn((4096, 4096), device="cuda", generator=gen).div_(64).bfloat16()
    r = torch.randn((1, 4096), device="cuda", generator=gen).bfloat16()
    queries = [task.make_inputs(shape, 100 + i, "cuda")[0] for i in range(50)]

    def steps(early: bool) -> list[torch.Tensor]:
        outs = []
        for query in queries:
            att = module.kernel(query, k, v, split_tokens=256, early_dependents=early)
            outs.append(gemv.kernel(att.view(1, -1), w, r, per_lane=8, block_n=2))
        torch.cuda.synchronize()
        return outs

    want = steps(False)
    assert not torch.equal(want[0], want[1])
    for got, expected in zip(steps(True), want, strict=True):
        assert torch.equal(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("counts", ["kept", "made-while-capturing"])
@pytest.mark.parametrize(
    "name, fold",
    [("triton_gqa_decode.py", {"merge": "fold"}), ("gluon_gqa_decode.py", {})],
)
def test_the_fold_replays_in_a_cuda_graph_on_new_queries(task, counts, name, fold) -> None:
    """A CUDA graph of the fold (the Triton candidate's, and the Gluon one's merge by the last
    split), replayed three times on new q copied into its input, gives the reference each time
    (the output is poisoned with NaN before each replay, so a merge that did not happen shows).
    With counts made while capturing (more than are kept) the graph zeroes its own, and the kept
    ones are left as they were; the kept ones end at 0."""
    module = candidate_module(task, name)  # nothing kept yet
    shape = next(s for s in task.shapes("cuda") if s.name == "b16-kv8192")
    q, k, v = task.make_inputs(shape, 11, "cuda")
    # 1024 tokens: 8 splits at any batch, so the batch-1 call compiles the kernel captured.
    run = lambda q, k, v: module.kernel(q, k, v, split_tokens=1024, **fold)  # noqa: E731
    if counts == "kept":
        run(q, k, v)
    else:
        run(q[:1], k[:1], v[:1])  # 8 counts kept; the capture needs 128
    torch.cuda.synchronize()
    kept = module._COUNTS[q.device]
    assert len(kept) == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(q, k, v)
    assert len(kept) == 1 and kept[0].numel() == (128 if counts == "kept" else 8)
    tol = task.tolerance("bfloat16")
    for seed in (12, 13, 14):
        q.copy_(task.make_inputs(shape, seed, "cuda")[0])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = task.reference(q.double(), k.double(), v.double())
        err = torch.linalg.vector_norm(out.double() - want) / torch.linalg.vector_norm(want)
        assert float(err) < tol, (seed, float(err))
        assert int(kept[0].abs().sum()) == 0


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
    kernel (merging or not), and the merge kernel let their dependents launch, and load, store
    and count nothing before griddepcontrol.wait (q comes from the kernel before; the cache may
    too)."""
    module = candidate_module(task, "triton_gqa_decode.py")
    split = _split_ptx(module, num_stages)
    assert_weights_stream_before_the_wait(split, 0)
    assert "atom." not in split
    for group_at_once in (False, True):
        fold = _split_ptx(module, num_stages, FOLD=True, BLOCK_S=16, GROUP_AT_ONCE=group_at_once)
        assert_weights_stream_before_the_wait(fold, 0)
        assert "atom.global.gpu.acq_rel.add" in fold
    merge = _merge_ptx(module, EARLY_DEPENDENTS=False)
    assert_weights_stream_before_the_wait(merge, 0)


def _merge_ptx(module, **constexprs) -> str:
    """The merge kernel's sm_90 PTX (d 128, 16 splits a block, 4 warps)."""
    types = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "out_ptr": "*bf16", "n_splits": "i32"}
    constexprs = {"D": 128, "BLOCK_S": 16, "PDL": True} | constexprs
    return hopper_ptx(module._merge_kernel, types, constexprs, 4)


def test_early_dependents_launch_the_next_kernel_before_the_merges_wait(task) -> None:
    """Compiled for sm_90: with early_dependents, the merge kernel lets its dependents launch
    before griddepcontrol.wait (and not again after it), and still loads and stores nothing
    before the wait; without it, only after the wait."""
    module = candidate_module(task, "triton_gqa_decode.py")
    before, wait, after = _merge_ptx(module, EARLY_DEPENDENTS=True).partition("griddepcontrol.wait")
    assert wait
    assert before.count("griddepcontrol.launch_dependents") == 1
    assert "griddepcontrol.launch_dependents" not in after
    assert "ld.global" not in before and "st.global" not in before
    assert "ld.global" in after and "st.global" in after


def _split_ptx(module, num_stages: int, **options) -> str:
    """The split kernel's sm_90 PTX at batch 1's launch (8 KV heads of 4 query heads, d 128,
    64-token tiles, 4 warps; no fold, early history or prefetch), with `options` (FOLD and
    BLOCK_S, EARLY, PREFETCH) on top; the cache's strides are multiples of 16 elements, as at
    every real shape."""
    names = ("kv_len", "tokens_per_split", "n_splits", "stride_qb", "stride_qh", "stride_kb")
    names += ("stride_kh", "stride_kn", "stride_vb", "stride_vh", "stride_vn")
    types = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr"), "*bf16")
    types |= dict.fromkeys(("po_ptr", "plse_ptr"), "*fp32")
    types |= dict.fromkeys(names, "i32") | {"scale_log2": "fp32"}
    constexprs = {"HKV": 8, "GROUP": 4, "GROUP_PAD": 16, "D": 128, "BLOCK_N": 64, "USE_DOT": True}
    constexprs |= {"PDL": True, "EARLY": False, "FOLD": False, "BLOCK_S": 1, "GROUP_AT_ONCE": False}
    constexprs |= {"PREFETCH": False, "LINE": 64} | options
    if constexprs["FOLD"]:
        types |= {"out_ptr": "*bf16", "count_ptr": "*i32"}
    else:
        constexprs |= {"out_ptr": None, "count_ptr": None}
    strides = tuple(n for n in names if n.startswith("stride_"))
    return hopper_ptx(module._split_kernel, types, constexprs, 4, num_stages, strides)


@pytest.mark.parametrize("num_stages", [1, 3])
def test_the_l2_prefetch_reads_nothing_in_and_comes_before_the_wait(task, num_stages) -> None:
    """Compiled for sm_90: with prefetch_l2, the split kernel issues prefetch.global.L2 for its
    K and V lines (one each a thread a 64-token tile: 64 rows of two 128-byte lines over 128
    threads) before griddepcontrol.wait and none after it, and still loads nothing before it."""
    module = candidate_module(task, "triton_gqa_decode.py")
    ptx = _split_ptx(module, num_stages, PREFETCH=True)
    before, _, after = ptx.partition("griddepcontrol.wait")
    assert before.count("prefetch.global.L2") == 2
    assert "prefetch" not in after
    assert_weights_stream_before_the_wait(ptx, 0)


@pytest.mark.parametrize("num_stages", [1, 3])
def test_early_history_loads_only_the_first_tiles_k_and_v_before_the_wait(task, num_stages) -> None:
    """Compiled for sm_90: with early_history, the split kernel's loads before
    griddepcontrol.wait are the first tile's K and V, whole 16-byte vectors (64 rows of 128
    bfloat16 over 128 threads: 8 each), and nothing else (q comes after it)."""
    module = candidate_module(task, "triton_gqa_decode.py")
    ptx = _split_ptx(module, num_stages, EARLY=True)
    assert_weights_stream_before_the_wait(ptx, 0, other_early=2 * 8)
    before = ptx.partition("griddepcontrol.wait")[0]
    assert all(".v4." in line for line in before.splitlines() if "ld.global" in line)


def test_an_empty_cache_is_refused_with_a_clear_error(task) -> None:
    module = candidate_module(task, "triton_gqa_decode.py")
    q, k, v = task.make_inputs(task.shapes("cpu")[0], 1, "cpu")
    for merge in ("kernel", "fold"):
        with pytest.raises(ValueError, match="the cache is empty"):
            module.kernel(q, k[:, :, :0], v[:, :, :0], merge=merge)


def test_gluon_candidate_runs_on_the_gpu_only(task) -> None:
    assert GLUON in task.candidates["cuda"]
    assert GLUON not in task.candidates["cpu"]


def test_gluon_candidate_refuses_what_it_cannot_run_naming_why(task) -> None:
    """Contiguous bf16/fp16 inputs, head_dim 128, whole groups of at most 64 query heads and
    whole cache tiles on sm_90; anything else is refused before any launch, pointing to the
    Triton candidate."""
    module = candidate_module(task, GLUON)

    def bf16(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.bfloat16)

    q, k = bf16(2, 32, 128), bf16(2, 8, 256, 128)
    cases = [
        ((q.float(), k.float(), k.float()), "bf16 or fp16"),
        ((q, k.half(), k.half()), "one dtype"),
        ((q, k, bf16(2, 8, 128, 128)), "equal caches"),
        ((q, k.transpose(1, 2).contiguous().transpose(1, 2), k.clone()), "contiguous"),
        ((bf16(2, 32, 64), bf16(2, 8, 256, 64), bf16(2, 8, 256, 64)), "head_dim 128"),
        ((q, bf16(1, 8, 256, 128), bf16(1, 8, 256, 128)), "head_dim 128"),
        ((bf16(2, 30, 128), k, k), "q_heads 30 on kv_heads 8"),
        ((bf16(1, 130, 128), bf16(1, 2, 256, 128), bf16(1, 2, 256, 128)), "at most 64"),
        ((q, bf16(2, 8, 200, 128), bf16(2, 8, 200, 128)), "kv_len 200"),
        ((q, bf16(2, 8, 0, 128), bf16(2, 8, 0, 128)), "kv_len 0"),
        ((q[0], k[0], k[0]), "needs q"),
        ((q, k, k), "sm_90 GPU"),  # here on the CPU
    ]
    for inputs, why in cases:
        with pytest.raises(ValueError, match=f"{why}.*triton_gqa_decode.py"):
            module.kernel(*inputs)
    with pytest.raises(ValueError, match="num_stages 1"):
        module.kernel(q, k, k, num_stages=1)
    with pytest.raises(ValueError, match=r"block_n 128 at 8 stages needs \d+ bytes"):
        module.kernel(q, k, k, block_n=128, num_stages=8)
    shifted = torch.zeros(k.numel() + 1, dtype=torch.bfloat16)[1:].view(k.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        module.kernel(q, shifted, k)
    with pytest.raises(ValueError, match="split_tokens 100 is not 0 or a multiple of block_n 64"):
        module.kernel(q, k, k, split_tokens=100)


def test_gluon_splits_fill_one_wave_unless_told(task) -> None:
    split_tiles = candidate_module(task, GLUON).split_tiles
    # 132 SMs, 8 KV heads.
    assert split_tiles(8, 2048, 132, 0, 64) == 128  # b1 at 128k: 16 splits
    assert split_tiles(32, 2048, 132, 0, 64) == 512  # b4 at 128k: 4 splits
    assert split_tiles(128, 128, 132, 0, 64) == 128  # b16: one split
    assert split_tiles(8, 3, 132, 0, 64) == 1  # never more splits than tiles
    assert split_tiles(128, 128, 132, 1024, 64) == 16  # told: 1024 tokens a split
    assert split_tiles(8, 2, 132, 4096, 64) == 2  # told more tokens than the cache has


def _gluon_build(
    module, block_n: int, stages: int, split: bool = False, merge_rows: int = 4, early=False
):
    from triton.runtime.jit import mangle_type

    from tests.kernels.task_checks import hopper_build

    def desc(rows: int) -> str:
        return mangle_type(
            module._descriptor(torch.zeros(1, 1024, 128, dtype=torch.bfloat16), rows)
        )

    types = {"q_desc": desc(64), "k_desc": desc(block_n), "v_desc": desc(block_n)}
    types |= {"out_ptr": "*bf16", "part_ptr": "*fp32", "lse_ptr": "*fp32", "count_ptr": "*i32"}
    types |= {"q_heads": "i32", "kv_heads": "i32", "kv_len": "i32", "tiles_per_split": "i32"}
    types |= {"scale_log2": "fp32"}
    constexprs = {"BLOCK_N": block_n, "STAGES": stages, "SPLIT": split}
    constexprs |= {"MERGE_ROWS": merge_rows, "EARLY": early}
    return hopper_build(module._gqa_kernel, types, constexprs, 4, multiples_of_16=("kv_len",))


@pytest.mark.parametrize(
    "block_n, stages, split, merge_rows, early",
    [
        (32, 8, False, 4, False),
        (64, 3, False, 4, False),
        (64, 4, True, 4, False),
        (64, 6, False, 4, False),
        (128, 3, True, 4, False),
        (128, 3, True, 32, False),
        (64, 3, True, 8, False),
        (64, 3, True, 16, False),
        (64, 3, True, 4, True),
        (32, 8, False, 4, True),
        (128, 3, True, 4, True),
    ],
)
def test_the_gluon_candidate_builds_for_sm90_within_an_sms_shared_memory(
    task, block_n, stages, split, merge_rows, early
) -> None:
    """Compiled for sm_90 (no GPU needed): every swept configuration, with splits and without,
    fits an SM's shared memory as shared_bytes counts it, spills nothing, gives the loader warp
    a 24-register budget, and keeps the products on wgmma; with splits, the merge's count is
    one acq_rel atomic after a barrier, and its blocks of splits (16 splits of 4 rows, 8 of 8, 4 of
    16, 2 of 32) spill nothing either; so with early_history."""
    pytest.importorskip("triton")
    from tests.kernels.task_checks import setmaxnreg_budgets, sm90_resources

    module = candidate_module(task, GLUON)
    compiled = _gluon_build(module, block_n, stages, split, merge_rows, early)
    row = sm90_resources(compiled)
    assert row["spill_bytes"] == 0
    assert 0 < row["shared_bytes"] <= module.shared_bytes(block_n, stages) <= module.SHARED_BYTES
    ptx = compiled.asm["ptx"]
    assert 24 in setmaxnreg_budgets(ptx)
    assert "wgmma.mma_async" in ptx
    atomics = [line for line in ptx.splitlines() if "atom." in line]
    assert len(atomics) == split and all(".gpu.acq_rel." in line for line in atomics)


@pytest.mark.parametrize("split", [False, True])
def test_the_gluon_candidate_waits_for_the_kernel_before_it_in_both_partitions(task, split) -> None:
    """Programmatic dependent launch done safely in the warpgroup and in the loader warp:
    griddepcontrol.wait before any global load, store, atomic or TMA copy; the one
    launch_dependents is the loader's, after its wait and before its first copy
    (task_checks.assert_partitions_wait_before_memory)."""
    pytest.importorskip("triton")
    module = candidate_module(task, GLUON)
    assert_partitions_wait_before_memory(_gluon_build(module, 64, 4, split).asm["ttgir"], 2)


def test_gluon_early_history_asks_for_k_and_v_before_the_wait_but_never_q(task) -> None:
    """Compiled for sm_90 with early_history: the loader warp's only memory ops before its wait
    are one loop's K and V copies (two 64-column chunks of each: the tiles that fill the ring,
    which of them the kernel decides at run time), never the queries' (told apart by their
    64-row block; the tiles here are 32 keys), whose two copies follow the wait and the trigger;
    the warpgroup still waits before touching memory."""
    pytest.importorskip("triton")
    ttgir = _gluon_build(candidate_module(task, GLUON), 32, 3, True, early=True).asm["ttgir"]
    assert_partitions_wait_before_memory(ttgir, 2, early_copies=4)
    loader = "\n".join(ttgir_partitions(ttgir)[-1])
    before, _, after = loader.partition("griddepcontrol.wait")

    def copied(text: str) -> list[str]:
        """The block shape of each TMA copy: the queries' 64x64, the K and V tiles' 32x64."""
        copies = [line for line in text.splitlines() if "async_tma_copy_global_to_local" in line]
        # Triton 3.9 prints !tt.tensordesc<64x64xbf16, ...>, 3.6 !tt.tensordesc<tensor<64x64x...
        return [re.search(r"tensordesc<(?:tensor<)?(\d+x\d+)x", line).group(1) for line in copies]

    assert copied(before) == ["32x64"] * 4
    assert copied(after) == ["64x64"] * 2 + ["32x64"] * 4


# What the task's GPU shapes (bf16, 32 query heads on 8, 128-dim) leave out: fp16, groups of 1,
# 8 and 64 heads, the last program's query rows past the end of q, one tile, many stages'
# worth of wrap-arounds. In a child process with a time limit: a hang fails the test.
GLUON_PATHS = """
import torch
from loop.tasks import load_task
from tests.kernels.task_checks import assert_within_tolerance, candidate_module

task = load_task("gqa_decode")
module = candidate_module(task, "gluon_gqa_decode.py")
cases = [
    (3, 32, 8, 64, torch.bfloat16, {}),
    (2, 32, 8, 4096, torch.float16, {"block_n": 128, "num_stages": 3}),
    (5, 8, 8, 96, torch.bfloat16, {"block_n": 32, "num_stages": 2}),
    (2, 64, 8, 1024, torch.bfloat16, {"block_n": 32, "num_stages": 8}),
    (1, 64, 1, 640, torch.float16, {"num_stages": 6}),
    (17, 32, 8, 256, torch.bfloat16, {"block_n": 128, "num_stages": 2}),
    # splits: as many as fill the SMs (a last one shorter), told, one tile each, one in all
    (1, 32, 8, 64 * 131, torch.bfloat16, {}),
    (2, 64, 8, 4096 + 64, torch.float16, {"split_tokens": 1024}),
    (1, 8, 8, 640, torch.bfloat16, {"block_n": 32, "num_stages": 2, "split_tokens": 32}),
    (3, 32, 8, 2048, torch.bfloat16, {"split_tokens": 2048}),
    # merged in blocks: 35 splits 16 at a time (the last block short); 64 heads 32 rows at a
    # time, 20 splits 2 at a time; 16 heads in one pass, 40 splits 4 at a time
    (1, 32, 8, 64 * 70, torch.bfloat16, {"split_tokens": 128}),
    (1, 64, 1, 64 * 40, torch.float16, {"split_tokens": 128}),
    (1, 16, 1, 64 * 40, torch.bfloat16, {"split_tokens": 128}),
    # early_history: ring-filling tiles before the wait (one-tile splits: all but the last)
    (1, 32, 8, 4096, torch.bfloat16, {"early_history": True}),
    (2, 32, 8, 640, torch.bfloat16, {"block_n": 32, "split_tokens": 32, "early_history": True}),
    (3, 32, 8, 1024, torch.float16, {"num_stages": 6, "early_history": True}),
]
gen = torch.Generator(device="cuda").manual_seed(0)
for b, hq, hkv, n, dtype, params in cases:
    q = torch.randn(b, hq, 128, generator=gen, device="cuda").to(dtype) * 0.3
    k, v = (torch.randn(b, hkv, n, 128, generator=gen, device="cuda").to(dtype) for _ in "kv")
    got = module.kernel(q, k, v, **params).double()
    want = task.reference(q.double(), k.double(), v.double())
    assert_within_tolerance(task, got, want, dtype, b, hq, hkv, n, dtype, params)
assert int(module._COUNTS[torch.device("cuda", 0)][-1].abs().sum()) == 0
empty = torch.zeros(0, 32, 128, device="cuda", dtype=torch.bfloat16)
kv = torch.zeros(0, 8, 64, 128, device="cuda", dtype=torch.bfloat16)
assert module.kernel(empty, kv, kv).shape == (0, 32, 128)
"""


@pytest.mark.gpu
def test_gluon_candidate_paths_the_task_shapes_leave_out_on_gpu() -> None:
    run_in_child(GLUON_PATHS)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"block_n": 128, "num_stages": 3},
        {"block_n": 32, "num_stages": 8},
        {"split_tokens": 2048},
        {"block_n": 128, "num_stages": 3, "split_tokens": 8192},
        {"early_history": True},
    ],
)
def test_gluon_candidate_matches_the_reference_on_gpu(task, params) -> None:
    verdict = gpu_evaluate(task, [(GLUON, params)]).verdicts[0]
    assert verdict.accepted, verdict.reasons


@pytest.mark.gpu
def test_the_gluon_candidate_waits_for_the_kernel_that_writes_q_and_the_cache(task) -> None:
    """Launched with programmatic dependent launch right after kernels that write q, k and v
    2 ms late, it still reads the new ones."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, GLUON)
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv32768")
    q, k, v = task.make_inputs(shape, 7, "cuda")
    want = task.reference(q.double(), k.double(), v.double())
    assert_waits_for_late_inputs(module.kernel, (q, k, v), want)  # in 16 splits
    one = lambda q, k, v: module.kernel(q, k, v, split_tokens=32768)  # noqa: E731
    assert_waits_for_late_inputs(one, (q, k, v), want)

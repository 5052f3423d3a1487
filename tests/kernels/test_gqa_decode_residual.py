"""The GQA decode + output projection + residual task: reference, inputs, shapes, its torch
candidate on the CPU against a wrong kernel, and the Triton candidate (under the interpreter at
several split and row-block counts against mutants, its sm_90 build, and on the GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import evaluate_on_cpu, mutated
from tests.kernels.task_checks import (
    assert_shipped_accepted,
    assert_weights_stream_before_the_wait,
    assert_wrong_rejected,
    candidate_module,
    evaluate_with_wrong,
    gpu_evaluate,
    hopper_build,
    hopper_ptx,
    kept_counts_after_interpreted_calls,
    sm90_resources,
)
from tests.source_files import import_file

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

TRITON = "triton_gqa_decode_residual.py"

# Query head h paired with W_o's columns of head h + 1: the heads' outputs in the wrong slots.
WRONG = """
import math
import torch

LANGUAGE = "torch"


def kernel(q, k_cache, v_cache, w_o, r):
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    qg = q.float().reshape(b, hkv, hq // hkv, d) / math.sqrt(d)
    s = (qg[:, :, :, None, :] * k_cache.float()[:, :, None]).sum(-1)
    a = (torch.softmax(s, -1)[..., None] * v_cache.float()[:, :, None]).sum(-2)
    a = a.reshape(b, hq, d).roll(1, dims=1).reshape(b, 1, hq * d)
    return ((a * w_o.float()[None]).sum(-1) + r.float()).to(q.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("gqa_decode_residual")


def test_reference_is_gqa_decode_then_the_projection_and_the_residual(task) -> None:
    shape = task.shapes("cpu")[1]
    q, k, v, w_o, r = task.module.make_inputs(shape.to_dict(), 2, "cpu")
    attn = load_task("gqa_decode").reference(q, k, v).reshape(q.shape[0], -1)
    want = attn @ w_o.double().t() + r.double()
    torch.testing.assert_close(task.reference(q, k, v, w_o, r), want)
    projected = attn @ w_o.double().t()
    assert 0.1 < float(projected.std()) < 3.0 and 0.5 < float(r.std()) < 2.0


def test_the_peers_and_the_gpu_shapes(task) -> None:
    inputs = task.module.make_inputs(task.shapes("cpu")[0].to_dict(), 3, "cpu")
    want = task.reference(*inputs)
    for name in ("eager", "sdpa-gqa"):
        got = task.peers[name](*inputs)
        assert float((got.double() - want).norm() / want.norm()) < 1e-5, name
    gpu = {s.name: s for s in task.shapes("cuda")}
    assert set(gpu) == {"b1-kv4096", "b1-kv32768", "b16-kv4096"}
    one = gpu["b1-kv4096"]
    # the caches once (8 KV heads), q, W_o (4096 x 4096), r, and the output
    elements = 2 * 8 * 4096 * 128 + 32 * 128 + 4096 * 4096 + 4096 + 4096
    assert task.bytes_moved(one) == 2 * elements


def test_the_torch_candidate_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    shipped = [
        ("torch_gqa_decode_residual.py", {}),
        ("torch_gqa_decode_residual.py", {"chunk": 1024}),
    ]
    ev = evaluate_with_wrong(task, shipped, WRONG, tmp_path)
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


# The CPU shapes: 8 query heads on 2 KV heads, d 16, hidden 40, caches of 19, 64 (batch 2) and
# 200 tokens. 16-token tiles; 16-row blocks cut the 40 rows into 3 (the last ragged); a program
# takes 1, 2 or all 8 heads (8, 4 or 1 programs a row block), 1 or 2 heads' tiles ahead.
INTERPRETED = {
    "one-split": {"block_n": 16, "split_tokens": 256, "block_r": 64},
    "splits-of-16": {"block_n": 16, "split_tokens": 16, "block_r": 16, "heads_per_program": 2},
    "early": {"block_n": 16, "split_tokens": 32, "block_r": 16, "early_history": True},
    "head-a-program": {"block_n": 16, "block_r": 16, "heads_per_program": 1, "ahead": 1},
    "every-head": {"block_n": 16, "block_r": 32, "heads_per_program": 8, "ahead": 1},
}


def test_the_triton_candidate_under_the_interpreter_and_a_last_program_off_by_one(
    task, tmp_path
) -> None:
    """At 1 to 13 splits, one row block or three, 1 to 8 heads a program, with early history:
    the reference. A copy whose last program waits for one program too many writes nothing (and
    never resets a count); one whose merge drops the splits' weights is off wherever a head has
    several splits; one that multiplies every head by the tile of the head before it (the
    tiles ahead off by one) is off."""
    source = task.folder / TRITON
    specs = {name: (source, params) for name, params in INTERPRETED.items()}
    specs["late"] = (
        mutated(source, "if arrived == groups - 1:", "if arrived == groups:", tmp_path / "l.py"),
        INTERPRETED["splits-of-16"],
    )
    specs["unweighted"] = (
        mutated(
            source,
            "weight = tl.exp2(lse - tl.max(lse, axis=0))",
            "weight = tl.where(s_ok, 1.0, 0.0)",
            tmp_path / "unweighted.py",
        ),
        INTERPRETED["splits-of-16"],
    )
    specs["stale-tile"] = (
        mutated(
            source,
            "w_after = _w_tile(w_rows + (i + 2) * D, rows_ok)",
            "w_after = _w_tile(w_rows + (i + 1) * D, rows_ok)",
            tmp_path / "stale.py",
        ),
        INTERPRETED["early"],
    )
    ev = evaluate_on_cpu(task, specs)
    for name in INTERPRETED:
        verdict = ev.by_label(name)
        assert verdict.accepted, (name, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5, name
    late = {r.code for r in ev.by_label("late").reasons}
    assert late and late <= {"mismatch", "non-finite-output", "constant-output", "crash"}, late
    assert [r.code for r in ev.by_label("unweighted").reasons] == ["mismatch"]
    assert [r.code for r in ev.by_label("stale-tile").reasons] == ["mismatch"]


def test_every_count_is_back_at_zero_after_calls_that_grow_them(task) -> None:
    """Under the interpreter: a call with 1 row block, then one with 3 (more than are kept,
    which grows them), then 1 again: every kept count ends at 0."""
    calls = """
shape = task.SHAPES["cpu"][1]
inputs = task.make_inputs(shape, 1, "cpu")
for block_r in (64, 16, 64):
    m.kernel(*inputs, block_n=16, split_tokens=16, block_r=block_r)
"""
    assert kept_counts_after_interpreted_calls(task, TRITON, calls) == [0, 0]


def test_the_split_count_stays_within_one_merge_step(task) -> None:
    split_size = candidate_module(task, TRITON).split_size
    assert split_size(4096, 0, 64) == 128  # 32 splits: the H200's choice at b1 4k
    assert split_size(32768, 128, 64) == 512  # 64 splits, not 256
    assert split_size(19, 16, 16) == 16
    for kv_len in (1, 100, 4097, 131072):
        assert -(-kv_len // split_size(kv_len, 64, 64)) <= 64


def test_bad_inputs_are_refused_naming_why(task) -> None:
    kernel = candidate_module(task, TRITON).kernel
    q, k, v, w_o, r = task.make_inputs(task.shapes("cpu")[0], 1, "cpu")
    with pytest.raises(ValueError, match="the cache is empty"):
        kernel(q, k[:, :, :0], v[:, :, :0], w_o, r)
    with pytest.raises(ValueError, match=r"w_o must be \(hidden, 128\)"):
        kernel(q, k, v, w_o[:, :100], r)
    with pytest.raises(ValueError, match=r"r \(1, hidden\)"):
        kernel(q, k, v, w_o, r[:, :30])
    with pytest.raises(ValueError, match="ahead 3: 1 or 2"):
        kernel(q, k, v, w_o, r, ahead=3)


def _projection_build(
    module, block_r: int, heads: int, ahead: int, num_warps: int, late: bool = False
):
    """The projection kernel built for sm_90 at Llama-3-8B's widths (32 heads of 128), for one
    sequence."""
    types = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "w_ptr": "*bf16", "r_ptr": "*bf16"}
    types |= {"y_ptr": "*bf16", "ws_ptr": "*fp32", "count_ptr": "*i32"}
    types |= dict.fromkeys(("batch", "n_rows", "n_splits"), "i32")
    constexprs = {"HQ": 32, "D": 128, "BLOCK_R": block_r, "BLOCK_S": 32, "PDL": True}
    constexprs |= {"HEADS": heads, "AHEAD": ahead, "SEQS": 1, "LATE_DEPENDENTS": late}
    return hopper_build(module._merge_project, types, constexprs, num_warps, 3, ("n_rows",))


# (block_r, heads_per_program, ahead, num_warps) of every configuration the gqaresidual sweep
# runs (scripts/bench_tasks_gpu.py): each must build without spilling.
_SWEEP = next(
    plan for plan in import_file(SCRIPTS / "bench_tasks_gpu.py").PLANS if plan.tag == "gqaresidual"
)
PROJECTIONS = sorted(
    {(c["block_r"], c["heads_per_program"], c["ahead"], c["num_warps"]) for c in _SWEEP.configs}
)


@pytest.mark.parametrize(("block_r", "heads", "ahead", "num_warps"), PROJECTIONS)
def test_the_projection_streams_only_its_first_tiles_before_the_wait(
    task, block_r, heads, ahead, num_warps
) -> None:
    """Compiled for sm_90 (no GPU needed): the projection kernel loads its first `ahead` tiles
    of W_o (block_r x 128 bfloat16 each, in 16-byte vectors over the block's threads) before
    griddepcontrol.wait and nothing else, the other heads' tiles after it; it lets the next
    kernel launch after the wait, counts only after it, and spills no register."""
    build = _projection_build(candidate_module(task, TRITON), block_r, heads, ahead, num_warps)
    ptx = build.asm["ptx"]
    tile = block_r * 128 * 2 // 16 // (32 * num_warps)
    early = min(ahead, heads) * tile
    assert_weights_stream_before_the_wait(ptx, early, later_weights=heads > ahead)
    after = ptx.partition("griddepcontrol.wait")[2]
    weights_after = [
        line for line in after.splitlines() if "ld.global" in line and "evict_first" in line
    ]
    assert len(weights_after) == (heads - early // tile) * tile
    assert "atom.global.gpu.acq_rel.add" in after
    assert sm90_resources(build)["spill_bytes"] == 0


def test_the_split_kernel_reads_nothing_before_the_wait_but_early_history(task) -> None:
    module = candidate_module(task, TRITON)
    names = ("kv_len", "tokens_per_split", "n_splits", "stride_qb", "stride_qh", "stride_kb")
    names += ("stride_kh", "stride_kn", "stride_vb", "stride_vh", "stride_vn")
    types = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr"), "*bf16")
    types |= dict.fromkeys(("po_ptr", "plse_ptr"), "*fp32")
    types |= dict.fromkeys(names, "i32") | {"scale_log2": "fp32"}
    constexprs = {"HKV": 8, "GROUP": 4, "GROUP_PAD": 16, "D": 128, "BLOCK_N": 64, "PDL": True}
    strides = tuple(n for n in names if n.startswith("stride_"))
    for early, vectors in ((False, 0), (True, 2 * 8)):
        ptx = hopper_ptx(module._split_kernel, types, constexprs | {"EARLY": early}, 4, 3, strides)
        assert_weights_stream_before_the_wait(ptx, 0, other_early=vectors)


GPU_CONFIGS = [
    {},
    {"early_history": True, "split_tokens": 128, "heads_per_program": 1, "ahead": 1},
    {"block_r": 64, "num_warps": 4, "split_tokens": 256, "heads_per_program": 4},
    {"block_n": 128, "split_tokens": 2048, "num_stages": 2, "heads_per_program": 32},
    {"block_r": 64, "heads_per_program": 1, "ahead": 1, "num_warps": 4, "late_dependents": True},
]


@pytest.mark.parametrize("late", [False, True])
def test_the_next_kernel_is_let_in_after_the_wait_or_after_the_count(task, late) -> None:
    """Compiled for sm_90: the one trigger that lets the next kernel launch comes right after
    griddepcontrol.wait, before the partials are read, or with late_dependents after the
    program has stored its sums and counted."""
    ptx = _projection_build(candidate_module(task, TRITON), 64, 4, 2, 4, late).asm["ptx"]
    after = ptx.partition("griddepcontrol.wait")[2]
    assert after.count("griddepcontrol.launch_dependents") == 1
    trigger = after.index("griddepcontrol.launch_dependents")
    first_read = min(after.index(line) for line in after.splitlines() if "ld.global" in line)
    count = after.index("atom.global.gpu.acq_rel.add")
    assert (trigger > count) if late else (trigger < first_read)


@pytest.mark.gpu
def test_the_triton_candidate_on_the_gpu(task) -> None:
    ev = gpu_evaluate(task, [(TRITON, params) for params in GPU_CONFIGS])
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)
        assert set(verdict.shapes) == {s.name for s in task.shapes("cuda")}


@pytest.mark.gpu
@pytest.mark.parametrize("late", [False, True])
def test_the_candidate_waits_for_the_kernels_that_write_q_the_cache_and_r(task, late) -> None:
    """Launched with programmatic dependent launch right after kernels that write q, k, v or r
    2 ms late, the split kernel still reads the new q and cache, and the projection the split's
    partials and the new r (W_o, which nothing in a step writes, is read before its wait)."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, TRITON)
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    q, k, v, w_o, r = task.make_inputs(shape, 7, "cuda")
    want = task.reference(q, k, v, w_o, r)
    assert_waits_for_late_inputs(
        lambda q, k, v, r: module.kernel(q, k, v, w_o, r, late_dependents=late), (q, k, v, r), want
    )


@pytest.mark.gpu
def test_a_cuda_graph_of_the_candidate_replays_on_new_queries(task) -> None:
    """Captured once and replayed on new q copied into its input (the output poisoned with NaN
    before each replay): the reference each time, and every count back at 0."""
    module = candidate_module(task, TRITON)
    shape = next(s for s in task.shapes("cuda") if s.name == "b16-kv4096")
    q, k, v, w_o, r = task.make_inputs(shape, 11, "cuda")
    module.kernel(q, k, v, w_o, r)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = module.kernel(q, k, v, w_o, r)
    for seed in (12, 13):
        q.copy_(task.make_inputs(shape, seed, "cuda")[0])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = task.reference(q, k, v, w_o, r)
        err = torch.linalg.vector_norm(out.double() - want) / torch.linalg.vector_norm(want)
        assert float(err) < task.tolerance("bfloat16"), (seed, float(err))
    assert all(int(c.abs().sum()) == 0 for c in module._COUNTS[q.device])

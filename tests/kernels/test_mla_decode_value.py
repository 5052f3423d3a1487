"""The MLA decode + value projection task: reference, inputs, shapes, its torch candidate on the
CPU against a wrong kernel, the Gluon candidate (its split kernel built for sm_90 here, its
merge-and-project kernel under the interpreter against hand-cut partials and a mutant, and on
the GPU) and the CUDA C++ one (its split kernel built for sm_90a here, its barrier waits and
arrivals and its reads and writes of the slots stepped through in every order here, and on the
GPU)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import mutated
from tests.kernels.task_checks import (
    assert_shipped_accepted,
    assert_weights_stream_before_the_wait,
    assert_wrong_rejected,
    candidate_module,
    evaluate_with_wrong,
    gpu_evaluate,
    hopper_build,
    hopper_ptx,
    nvcc_with_sm90a,
    run_interpreted,
    setmaxnreg_budgets,
    sm90_resources,
)

GLUON = "gluon_mla_decode_value.py"
CUDA = "cuda_mla_decode_value.py"
NVCC = nvcc_with_sm90a(minimum=(12, 5))

# Every head projected by head 0's weight.
WRONG = """
import math
import torch

LANGUAGE = "torch"


def kernel(q_nope, q_pe, ckv, kpe, w_uv):
    qn, qp = q_nope.float() / math.sqrt(192), q_pe.float() / math.sqrt(192)
    s = (qn[:, :, None, :] * ckv.float()[:, None]).sum(-1)
    s = s + (qp[:, :, None, :] * kpe.float()[:, None]).sum(-1)
    o = (torch.softmax(s, -1)[..., None] * ckv.float()[:, None]).sum(2)
    return (o[:, :, None, :] * w_uv.float()[0][None, None]).sum(-1).to(q_nope.dtype)
"""


@pytest.fixture(scope="module")
def task():
    return load_task("mla_decode_value")


def test_reference_is_mla_decodes_then_each_heads_value_projection(task) -> None:
    shape = task.shapes("cpu")[1]
    q_nope, q_pe, ckv, kpe, w_uv = task.module.make_inputs(shape.to_dict(), 2, "cpu")
    o_lat = load_task("mla_decode").reference(q_nope, q_pe, ckv, kpe)
    want = torch.stack([o_lat[:, h] @ w_uv[h].double().t() for h in range(w_uv.shape[0])], 1)
    torch.testing.assert_close(task.reference(q_nope, q_pe, ckv, kpe, w_uv), want)
    assert 0.1 < float(want.std()) < 3.0


def test_the_eager_peer_and_the_gpu_shapes(task) -> None:
    shape = task.shapes("cpu")[0]
    inputs = task.module.make_inputs(shape.to_dict(), 3, "cpu")
    want = task.reference(*inputs)
    got = task.peers["eager"](*inputs)
    assert got.shape == want.shape and float((got.double() - want).norm() / want.norm()) < 1e-5
    gpu = {s.name: s for s in task.shapes("cuda")}
    assert {"b1-kv32768", "b16-kv4096", "b1-kv131072"} <= set(gpu)
    one = gpu["b1-kv32768"]
    # the cache once, the queries, W_UV once (128 heads x 128 x 512), the output
    cache = 32768 * 576 + 128 * 576 + 128 * 128 * 512
    assert task.bytes_moved(one) == 2 * (cache + 128 * 128)


def test_the_torch_candidate_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [("torch_mla_decode_value.py", {}), ("torch_mla_decode_value.py", {"chunk": 1024})],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


@pytest.mark.parametrize("name", [GLUON, CUDA])
def test_the_gpu_candidates_run_on_the_gpu_only_and_refuse_naming_why(task, name) -> None:
    assert task.candidates["cuda"] == [GLUON, CUDA]
    kernel = candidate_module(task, name).kernel
    args = [torch.zeros(s, dtype=torch.bfloat16) for s in ((1, 64, 512), (1, 64, 64))]
    args += [torch.zeros(s, dtype=torch.bfloat16) for s in ((1, 64, 512), (1, 64, 64))]
    with pytest.raises(ValueError, match=r"w_uv \(64, 96, 512\)"):
        kernel(*args, torch.zeros(64, 96, 512, dtype=torch.bfloat16))
    w_uv = torch.zeros(64, 128, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="block_k 8: a power of two dividing 512"):
        kernel(*args, w_uv, block_m=16, block_k=8)
    with pytest.raises(ValueError, match="block_k 96"):
        kernel(*args, w_uv, block_k=96)
    for slices in (0, 3, 16):  # 16 slices of 32 columns cannot take 64-column steps
        with pytest.raises(ValueError, match=f"column_slices {slices}: 512 columns"):
            kernel(*args, w_uv, block_k=64, column_slices=slices)
    with pytest.raises(ValueError, match="needs an sm_90 GPU"):
        kernel(*args, w_uv, block_k=32, column_slices=16)
    with pytest.raises(ValueError, match="needs an sm_90 GPU"):
        kernel(*args, w_uv)


def test_the_splits_stay_within_what_one_merge_step_reads(task) -> None:
    """One sequence of 64 heads over 129 tiles on 132 SMs: 129 one-tile splits would pass the
    merge's one step of MAX_SPLITS; the rule makes 65 splits of 2 tiles instead."""
    module = candidate_module(task, GLUON)
    assert module.split_tiles(1, 129, 132) == 2
    assert module.split_tiles(2, 1024, 132) == 16  # b1, 128 heads, 32k: 64 splits of 16
    for programs, tiles in ((1, 129), (1, 4096), (2, 4096), (32, 128), (128, 128)):
        per = module.split_tiles(programs, tiles, 132)
        assert -(-tiles // per) <= module.MAX_SPLITS


def test_the_gluon_split_kernel_builds_for_sm90(task) -> None:
    """The split kernel copied from gluon_mla_decode.py (its shared-probabilities order) builds
    for sm_90 with its two register budgets, within shared memory, spilling nothing."""
    from triton.runtime.jit import mangle_type

    module = candidate_module(task, GLUON)
    shapes = {"qn_desc": (64, 512), "qp_desc": (64, 64), "c_desc": (32, 512), "p_desc": (32, 64)}
    types = {
        name: mangle_type(module._descriptor(torch.zeros(1, 1024, cols, dtype=torch.bfloat16), r))
        for name, (r, cols) in shapes.items()
    }
    types |= {"po_ptr": "*fp32", "plse_ptr": "*fp32", "heads": "i32", "kv_len": "i32"}
    types |= {"tiles_per_split": "i32", "scale_log2": "fp32"}
    compiled = hopper_build(
        module._split_kernel, types, {"BLOCK_N": 32, "STAGES": 4}, num_warps=4,
        multiples_of_16=("heads", "kv_len"),
    )  # fmt: skip
    used = sm90_resources(compiled)
    assert used["spill_bytes"] == 0 and 0 < used["shared_bytes"] <= module.SHARED_BYTES
    assert {24, 240} <= setmaxnreg_budgets(compiled.asm["ptx"])
    assert module.shared_bytes(32, 4) <= module.SHARED_BYTES < module.shared_bytes(64, 3)


def test_the_cuda_candidate_refuses_what_its_split_kernel_does_not_build_for(task) -> None:
    kernel = candidate_module(task, CUDA).kernel
    shapes = ((1, 64, 512), (1, 64, 64), (1, 64, 512), (1, 64, 64), (64, 128, 512))
    args = [torch.zeros(s, dtype=torch.bfloat16) for s in shapes]
    builds = r"one of \[\(32, 4\), \(64, 2\)\]"
    with pytest.raises(ValueError, match=r"block_n 32 with num_stages 3: .*" + builds):
        kernel(*args, num_stages=3)
    with pytest.raises(ValueError, match=r"block_n 64 with num_stages 4: .*" + builds):
        kernel(*args, block_n=64, num_stages=4)
    with pytest.raises(ValueError, match="needs bf16 inputs"):
        kernel(*(t.half() for t in args))
    cache = [torch.zeros(1, 48, n, dtype=torch.bfloat16) for n in (512, 64)]
    with pytest.raises(ValueError, match="kv_len 48: a positive multiple of block_n 32"):
        kernel(args[0], args[1], *cache, args[4])
    cache = [torch.zeros(1, 96, n, dtype=torch.bfloat16) for n in (512, 64)]
    with pytest.raises(ValueError, match="kv_len 96: a positive multiple of block_n 64"):
        kernel(args[0], args[1], *cache, args[4], block_n=64, num_stages=2)


# ptxas's notes (C7510-C7518) when it makes every wgmma wait for the one before.
SERIALISED = "wgmma.mma_async instructions are serialized"
# The scores-first loop's first steps with P_{t-1} V waited for by wait_group 1 after S_{t+1} is
# issued (so that S_{t+1} would start sooner): ptxas cannot tell which group that wait retires.
# Two edits: the loop's drain moved into the other branch, then this branch's replaced.
WAIT_ONE = (
    (
        """        drain(t - 1);  // P_{t-1} V
        if constexpr (L::BETWEEN) {""",
        """        if constexpr (L::BETWEEN) {
            drain(t - 1);""",
    ),
    (
        """            // S_{t+1} while P_t is awaited
            issue_scores<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_FIRST, t + 1),
                               c.bar(LOADED_SECOND, t + 1), c.parity(t + 1));""",
        """            issue_scores<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_FIRST, t + 1),
                               c.bar(LOADED_SECOND, t + 1), c.parity(t + 1));
            asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
            acc_fence<128>(o);
            if (t >= 1) c.release(t - 1);""",
    ),
)


def _ptxas_log(source: str, folder: Path) -> str:
    """ptxas's notes on `source` built as load_inline builds it (its nvcc flags, -O3, sm_90a)."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    cu = folder / "split.cu"
    cu.write_text(source)
    built = subprocess.run(
        [NVCC, *COMMON_NVCC_FLAGS, "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas",
         "-v", "-c", str(cu), "-o", str(folder / "split.o")],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return built.stderr


@pytest.mark.skipif(
    NVCC is None, reason="no CUDA 12.5+ nvcc (sm_90a, cudaGetDriverEntryPointByVersion)"
)
def test_the_cuda_split_kernel_keeps_its_products_in_flight_on_sm90a(task, tmp_path) -> None:
    """Built for sm_90a (32-row tiles in a ring of 4, 64-row tiles in a ring of 2, each with the
    other's value product after a warpgroup's scores or between their two groups), ptxas
    serialises no wgmma (else each would wait for the one before, and a warpgroup's scores would
    not run while it awaits the other's probabilities) and spills nothing; with the loop's first
    wait after the scores' issue, it serialises them, as this check must catch."""
    source = candidate_module(task, CUDA).cuda_source()
    log = _ptxas_log(source, tmp_path)
    assert SERIALISED not in log, log
    builds = 2 * len(candidate_module(task, CUDA).BUILDS)  # values_between False and True
    assert log.count("Compiling entry function '_Z16mla_split_kernel") == builds == 4, log
    assert log.count(" 0 bytes spill stores, 0 bytes spill loads") == builds, log
    for before, after in WAIT_ONE:
        assert source.count(before) == 1
        source = source.replace(before, after)
    assert SERIALISED in _ptxas_log(source, tmp_path)


# The CUDA split kernel's mbarrier protocol and its use of the slots as the steps of three roles
# (the loader, warpgroups 0 and 1): ("wait", barrier, parity) and ("arrive", barrier) on barriers
# ("q", 0) and (kind, slot); ("write", items) and ("read", items), items (region, slot, tile,
# content) with regions "h0" and "h1" (the latent halves warpgroups 0 and 1 multiply by P),
# "rope" (the rope chunk, where the owner then writes P^T) and "stats" (the published maxima and
# sums), content "k" (loaded) or "p" (written by the tile's owner); ("load", items), a read that
# ends at once (take's of the stats); ("done",), a warpgroup's wait for all its products, which
# ends its reads. Every barrier completes a phase at each arrival (the loader's expect_tx and
# its copies as one arrival; a warpgroup's four warps, or its 128 threads, as one); a loader's
# write lasts until its arrival (the copies in flight). On the GPU the loader goes on at once and
# the copies land in any order; the model holds it until they land, which loses nothing as every
# read of a slot comes after a wait on that tile's barrier for its group. Take's load of the stats
# is checked too, though a stale one always comes with a stale P^T in the same slot. The loader's
# steps are written here after its loop in mla_split_kernel; of the consumers', the order of the
# calls is read from consume<L, W> in the source (what schedules change), what each call does
# is written in steps_of, and the source lines both stand for are pinned in PROTOCOL_LINES. Data
# in registers (which P or which maxima a product or softmax takes) is not modelled: the GPU
# tests check the results.
def _loader_steps(n_tiles: int, stages: int) -> list[tuple]:
    steps = [("arrive", ("q", 0))]
    for j in range(n_tiles):
        slot, owner, free = j % stages, j % 2, (j // stages) & 1 ^ 1
        steps += [
            ("wait", (f"free{1 - owner}", slot), free),
            ("write", {(f"h{1 - owner}", slot, j, "k")}),
            ("arrive", ("first", slot)),
            ("wait", (f"free{owner}", slot), free),
            ("write", {(f"h{owner}", slot, j, "k"), ("rope", slot, j, "k")}),
            ("arrive", ("second", slot)),
        ]
    return steps


# consume<L, W>'s calls that wait, arrive or start products: drain(x) waits for every product and
# gives tile x's half back (x >= 0), issue_scores(.., slot_addr(x), ..) waits for tile x's loads
# and reads its slot (issue_scores_first and _second: its first group, its second), take(x) waits
# for its loads and its probabilities and loads its stats, softmax(x) writes and publishes tile
# x's, values_other(x) and values_own(x) read its slot.
_CALL = re.compile(
    r"\b(drain|take|softmax|values_other|values_own)\(([^,;)]*)|(issue_scores(?:_first|_second)?)"
    r"<L, W>\(s, c\.q0, c\.slot_addr\(([^)]*)\),((?:\s*c\.bar\(LOADED_\w+, [^)]*\),)+)\s*"
    r"c\.parity\(([^)]*)\)\)"
)
# The barriers each issue_scores call must name, in order.
_SCORES_BARS = {
    "issue_scores": ["LOADED_FIRST", "LOADED_SECOND"],
    "issue_scores_first": ["LOADED_FIRST"],
    "issue_scores_second": ["LOADED_SECOND"],
}
# What the model takes those calls, and the loader, to do: only the calls' order is read from the
# source, so these lines, whose effects steps_of and _loader_steps write by hand, are pinned: the
# consumers' slot, barrier, parity and stats addressing; take's three waits, then its loads of
# the stats; softmax's store of P^T into the rope chunk and of the stats, then its fence and
# publication; drain's wait for the products before the release, the release's barrier and
# finish's wait; issue_scores's two waits and the chunks read after each; the value products'
# chunks; the loader's slot and parity, its waits before each group and the chunks each loads;
# the arrival counts.
PROTOCOL_LINES = (
    """    __device__ uint32_t slot_addr(int t) const { return ring + (t % L::STAGES) * L::slot; }
    __device__ uint32_t bar(int kind, int t) const {
        return bar_addr(bars, kind, t % L::STAGES, L::STAGES);
    }
    __device__ uint32_t parity(int t) const { return (t / L::STAGES) & 1; }
    __device__ float* stat(int t, int which) const {
        return stats + ((t % L::STAGES) * 2 + which) * ROWS;""",
    """__device__ __forceinline__ uint32_t bar_addr(uint32_t bars, int kind, int slot, int stages) {
    return bars + 8 * (1 + kind * stages + slot);""",
    """        mbar_wait(c.bar(LOADED_FIRST, t), c.parity(t));
        mbar_wait(c.bar(LOADED_SECOND, t), c.parity(t));
        mbar_wait(c.bar(PUBLISHED, t), c.parity(t));
        tm0 = c.stat(t, 0)[c.r0];
        tm1 = c.stat(t, 0)[c.r0 + 8];
        trs0 = c.stat(t, 1)[c.r0];
        trs1 = c.stat(t, 1)[c.r0 + 8];
    };""",
    """        unsigned char* sp = (unsigned char*)__cvta_shared_to_generic(c.slot_addr(t)) +
                            (CHUNKS - 1) * L::chunk;
        store_p_transposed<TILE>(p, sp, c.r0, lane);
        if (lane % 4 == 0) {
            c.stat(t, 0)[c.r0] = sm0;
            c.stat(t, 0)[c.r0 + 8] = sm1;
            c.stat(t, 1)[c.r0] = srs0;
            c.stat(t, 1)[c.r0 + 8] = srs1;
        }
        asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
        mbar_arrive(c.bar(PUBLISHED, t));""",
    """        wg_wait0();
        acc_fence<128>(o);
        if (t >= 0) c.release(t);""",
    """    auto finish = [&]() {
        wg_wait0();""",
    "        if (lane == 0) mbar_arrive(bar(FREE_LEFT + half, t));",
    """    mbar_wait(first, parity);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) {  // the first step overwrites S (scale-d 0)
        const int c = 4 * (1 - W) + ks / 4;""",
    """    mbar_wait(second, parity);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 20; ++ks) {
        const int c = ks < 16 ? 4 * W + ks / 4 : CHUNKS - 1;""",
    "        return desc(slot_addr(t) + half * 4 * L::chunk + ks * 16 * 128, L::chunk, 1024);",
    "        const uint32_t p0 = c.slot_addr(t) + (CHUNKS - 1) * L::chunk;",
    """            const int slot = j % STAGES, owner = j % 2, row = kv_row + j * TILE;
            const uint32_t dst = ring + slot * L::slot, free_parity = ((j / STAGES) & 1) ^ 1;
            const uint32_t first = bar_addr(bars, LOADED_FIRST, slot, STAGES);
            const uint32_t second = bar_addr(bars, LOADED_SECOND, slot, STAGES);
            mbar_wait(bar_addr(bars, FREE_LEFT + 1 - owner, slot, STAGES), free_parity);
            mbar_expect_tx(first, 4 * L::chunk);
            for (int c = 4 * (1 - owner); c < 4 * (2 - owner); ++c) {""",
    """            mbar_wait(bar_addr(bars, FREE_LEFT + owner, slot, STAGES), free_parity);
            mbar_expect_tx(second, 5 * L::chunk);
            for (int c = 4 * owner; c < 4 * (owner + 1); ++c) {
                tma_load(dst + c * L::chunk, &c_map, 64 * c, row, second);
            }
            tma_load(dst + (CHUNKS - 1) * L::chunk, &p_map, 0, row, second);""",
    "        const int arrivals[BAR_KINDS] = {1, 1, 4, 4, 128};",
)


def _calls(code: str) -> list[tuple[str, str]]:
    """The calls of _CALL in `code`, in order: no other wait, arrival, product or use of a slot
    may be there, and each issue_scores names one tile throughout (comments left out)."""
    code = re.sub(r"//[^\n]*", "", code)
    leftover = _CALL.sub("", code)
    forbidden = (
        r"mbar_|release\(|\.bar\(|\.parity\(|wg_wait|wgmma|values_|scores|softmax|stat\(|slot_"
    )
    assert not re.search(forbidden, leftover), leftover
    calls = []
    for m in _CALL.finditer(code):
        if m[3]:
            bars = re.findall(r"c\.bar\((LOADED_\w+), ([^)]*)\)", m[5])
            assert [kind for kind, _ in bars] == _SCORES_BARS[m[3]], m[0]
            assert {x for _, x in bars} == {m[4]} == {m[6]}, m[0]
            calls.append((m[3], m[4]))
        else:
            calls.append((m[1], m[2]))
    return calls


def _consumer_parts(source: str, between: bool) -> dict:
    """consume<L, W>'s body, from its wait for Q to its finish(), cut into warpgroup 0's start
    (calls, then the t it sets), warpgroup 1's, the loop's calls (its L::BETWEEN branch or the
    other, between the lines both take) and the last tile's."""
    wait_q = "    mbar_wait(bars, 0);\n"
    body = source[source.index(wait_q) + len(wait_q) : source.index("    finish();\n}")]
    first, rest = body.split("    } else {", 1)
    second, rest = rest.split("    for (; t + 1 < n_tiles; t += 2) {", 1)
    loop, last = rest.split("    if (t < n_tiles) {", 1)
    head, rest = loop.split("        if constexpr (L::BETWEEN) {\n", 1)
    branch_between, rest = rest.split("        } else {\n", 1)
    branch_after, tail = rest.split("        }\n", 1)
    loop = head + (branch_between if between else branch_after) + tail
    starts = [int(re.search(r"\bt = (\d+);", part)[1]) for part in (first, second)]
    return {
        "start": [(_calls(first), starts[0]), (_calls(second), starts[1])],
        "loop": _calls(loop),
        "last": _calls(last),
    }


def _tile(arg: str, t: int) -> int:
    """A call's tile argument in the source (an integer, t, or t plus or minus an integer)."""
    m = re.fullmatch(r"(-?\d+)|t(?: ([+-]) (\d+))?", arg.strip())
    assert m, arg
    if m[1]:
        return int(m[1])
    return t + (int(m[3]) if m[2] == "+" else -int(m[3])) if m[2] else t


def _consumer_steps(w: int, n_tiles: int, stages: int, parts: dict) -> list[tuple]:
    def steps_of(name: str, x: int) -> list[tuple]:
        slot, parity = x % stages, x // stages & 1
        own, other = (f"h{w}", slot, x, "k"), (f"h{1 - w}", slot, x, "k")
        stats = ("stats", slot, x, "p")
        published = {("rope", slot, x, "p"), stats}
        first, second = [("wait", (kind, slot), parity) for kind in ("first", "second")]
        scores_first = [first, ("read", {other})]
        scores_second = [second, ("read", {own, ("rope", *own[1:])})]
        return {
            "drain": [("done",), *([("arrive", (f"free{w}", slot))] if x >= 0 else [])],
            "issue_scores": scores_first + scores_second,
            "issue_scores_first": scores_first,
            "issue_scores_second": scores_second,
            "take": [first, second, ("wait", ("ready", slot), parity), ("load", {stats})],
            "softmax": [("write", published), ("arrive", ("ready", slot))],
            "values_other": [("read", {own, ("rope", slot, x, "p")})],
            "values_own": [("read", {own})],
        }[name]

    def run(calls: list[tuple[str, str]], t: int) -> list[tuple]:
        return [step for name, x in calls for step in steps_of(name, _tile(x, t))]

    calls, t = parts["start"][w]
    steps = [("wait", ("q", 0), 0), *run(calls, t)]
    while t + 1 < n_tiles:
        steps += run(parts["loop"], t)
        t += 2
    if t < n_tiles:
        steps += run(parts["last"], t)
    return [*steps, ("done",)]  # finish()


def _reads_in_flight(steps: list[tuple]) -> list[frozenset]:
    """What a role's products are reading after each count of its steps."""
    reads, now = [frozenset()], frozenset()
    for step in steps:
        if step[0] == "read":
            now = now | step[1]
        elif step[0] == "done":
            now = frozenset()
        reads.append(now)
    return reads


def _clash(writes: set, reading: list[frozenset]) -> tuple | None:
    """A write and a read in flight of the same region and slot that expects other content."""
    return next(
        ((w, r) for w in writes for rs in reading for r in rs if r[:2] == w[:2] and r != w), None
    )


def _explore(n_tiles: int, stages: int, parts: dict) -> tuple | None:
    """The first fault found in a reachable state, as (fault, the roles' positions (loader,
    warpgroup 0, warpgroup 1), detail): "stuck", none can take its next step though one has steps
    left; "overwrite", a write lands in a region and slot that a product in flight reads for
    other content (the detail: the write and the read); "stale", a read or load finds other
    content there than it expects (the detail: what it expects, what is there). None when no
    interleaving has a fault. A wait on parity p passes once the barrier has completed a phase of
    parity p and not the next: once the count of its completed phases has the other parity (a
    fresh barrier passes 1). The loader's copies land at its arrival and are in flight from its
    write step to it."""
    roles = [_loader_steps(n_tiles, stages)]
    roles += [_consumer_steps(w, n_tiles, stages, parts) for w in (0, 1)]
    reads = [_reads_in_flight(steps) for steps in roles]
    seen, todo = set(), [((0, 0, 0), frozenset())]
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        at, content = state[0], dict(state[1])
        reading = [reads[i][n] for i, n in enumerate(at)]
        # The loader's last step a write: its copies are in flight until its next, an arrival.
        copying = roles[0][at[0] - 1] if at[0] else ("start",)
        if copying[0] == "write" and (clash := _clash(copying[1], reading)):
            return "overwrite", at, clash
        phases = Counter(
            step[1] for steps, n in zip(roles, at, strict=True) for step in steps[:n]
            if step[0] == "arrive"
        )  # fmt: skip
        ready = [
            i for i, (steps, n) in enumerate(zip(roles, at, strict=True))
            if n < len(steps) and (steps[n][0] != "wait" or phases[steps[n][1]] % 2 != steps[n][2])
        ]  # fmt: skip
        if not ready and at != tuple(len(steps) for steps in roles):
            return "stuck", at, None
        for i in ready:
            step, now = roles[i][at[i]], content
            if step[0] in ("read", "load"):
                for item in sorted(step[1]):
                    if content.get(item[:2]) != item[2:]:
                        return "stale", at, (item, content.get(item[:2]))
            if step[0] == "write" and i > 0:
                if clash := _clash(step[1], reading):
                    return "overwrite", at, clash
                now = {**content, **{item[:2]: item[2:] for item in step[1]}}
            if step[0] == "arrive" and copying[0] == "write" and i == 0:
                now = {**content, **{item[:2]: item[2:] for item in copying[1]}}
            todo.append(((*at[:i], at[i] + 1, *at[i + 1 :]), frozenset(now.items())))
    return None


def test_every_interleaving_of_the_cuda_split_kernels_barriers_finishes(task) -> None:
    """In each build's ring, splits of 1 to 8 tiles, the consumers' steps in the order the
    source takes them (with the other's value product after a warpgroup's scores, or between
    their two groups): whatever the order the loader and the two warpgroups take their steps in,
    none is left waiting for a phase that has already passed twice or will never come, no copy or
    store lands in a region a product in flight still reads, and every product and load finds
    the tile it is for."""
    module = candidate_module(task, CUDA)
    assert all(line in module.CUDA_SRC for line in PROTOCOL_LINES)
    common = {"drain", "take", "softmax", "values_other", "values_own"}
    for between, scores in (
        (False, {"issue_scores"}),
        (True, set(_SCORES_BARS) - {"issue_scores"}),
    ):
        parts = _consumer_parts(module.CUDA_SRC, between)
        assert {name for name, _ in parts["loop"]} == common | scores
        for _, stages in module.BUILDS:
            for n_tiles in range(1, 9):
                assert _explore(n_tiles, stages, parts) is None, (between, n_tiles, stages)


def test_a_ring_of_three_slots_can_leave_a_warpgroup_waiting_forever(task) -> None:
    """The check above can fail: in a ring of three, tile j's first group of chunks (the half
    tile j - 3's owner gives back) can be loaded before the other warpgroup has waited for tile
    j - 3's, whose phase has then passed twice."""
    parts = _consumer_parts(candidate_module(task, CUDA).CUDA_SRC, between=False)
    assert all(_explore(n_tiles, 3, parts) is None for n_tiles in (1, 2, 3))
    fault, (loader, _, wg1), _ = _explore(4, 3, parts)
    assert fault == "stuck"
    assert _loader_steps(4, 3)[loader - 1] == ("arrive", ("first", 0))  # tile 3's first group
    assert _consumer_steps(1, 4, 3, parts)[wg1] == ("wait", ("first", 0), 0)  # tile 0's


# The loop's lines with the other's value product after the scores (12 spaces in).
LOOP_TAKE = "            take(t);\n            drain(-1);  // S_{t+1}\n"
LOOP_PRODUCT = "            values_other(t);\n            drain(t);\n"


def test_the_protocol_check_reads_the_source_as_written(task) -> None:
    """The consumers' steps come from the source as written. With the loop's drain(t) moved
    from after the other's product to before take(t), a warpgroup gives back its half of the
    other's tile before it has waited for it, and in a ring of two the loader can load the
    slot's next tile into that half while the product reads it; a release outside the calls the
    check knows, and scores whose barriers name another tile than their slot, are refused rather
    than read past."""
    source = candidate_module(task, CUDA).CUDA_SRC
    assert source.count(LOOP_TAKE) == source.count(LOOP_PRODUCT) == 1
    moved = source.replace(LOOP_TAKE, "            drain(t);\n" + LOOP_TAKE)
    parts = _consumer_parts(moved.replace(LOOP_PRODUCT, "            values_other(t);\n"), False)
    assert [name for name, _ in parts["loop"]].count("drain") == 3
    assert _explore(4, 2, parts)[0] == "overwrite"
    released = source.replace(LOOP_TAKE, "            c.release(t);\n" + LOOP_TAKE)
    with pytest.raises(AssertionError, match=r"c\.release\(t\)"):
        _consumer_parts(released, False)
    scores = "issue_scores<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_FIRST, t + 1)"
    assert source.count(scores) == 1
    with pytest.raises(AssertionError, match="issue_scores"):
        _consumer_parts(source.replace(scores, scores[:-6] + "t)"), False)
    scores = "issue_scores_second<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_SECOND"
    assert source.count(scores) == 1
    with pytest.raises(AssertionError, match="issue_scores_second"):
        _consumer_parts(source.replace(scores, scores.replace("SECOND", "FIRST")), True)


# Source mutants that let data go wrong: (which loop, (lines, what they become), ..., the first
# fault the search meets in a ring of two). After the scores: the value product on the other's
# tile issued after the slot's half is given back; the softmax's P^T stored while the scores
# still read the rope chunk; the value product on the other's tile issued before its
# probabilities are published (moved). Between the score groups: P^T stored while the second
# group still reads the rope chunk.
DATA_MUTANTS = {
    "released_before_read": (
        False,
        ((LOOP_PRODUCT, "            drain(t);\n            values_other(t);\n"),),
        ("overwrite", (("h0", 1, 3, "k"), ("h0", 1, 1, "k"))),
    ),
    "p_over_the_scores_rope": (
        False,
        (
            (
                "            drain(-1);  // S_{t+1}\n            softmax(t + 1, tm0, tm1);\n",
                "            softmax(t + 1, tm0, tm1);\n            drain(-1);\n",
            ),
        ),
        ("overwrite", (("rope", 1, 1, "p"), ("rope", 1, 1, "k"))),
    ),
    "product_before_publication": (
        False,
        (
            (LOOP_TAKE, "            values_other(t);\n" + LOOP_TAKE),
            (LOOP_PRODUCT, "            drain(t);\n"),
        ),
        ("stale", (("rope", 0, 0, "p"), (0, "k"))),
    ),
    "between_p_over_the_scores_rope": (
        True,
        (
            (
                "            drain(t);  // S_{t+1} and P_t V\n"
                "            softmax(t + 1, m0, m1);\n",
                "            softmax(t + 1, m0, m1);\n            drain(t);\n",
            ),
        ),
        ("overwrite", (("rope", 1, 1, "p"), ("rope", 1, 1, "k"))),
    ),
}


@pytest.mark.parametrize("mutant", sorted(DATA_MUTANTS))
def test_the_protocol_check_catches_a_slot_overwritten_or_read_too_early(task, mutant) -> None:
    """The data half of the check can fail: with each mutant, some interleaving of four tiles in a
    ring of two overwrites what a product still reads, or reads what is not there yet (the first
    such fault the search meets, named: the write and the read, or what the read expects and what
    it finds)."""
    source = candidate_module(task, CUDA).CUDA_SRC
    between, edits, (fault, detail) = DATA_MUTANTS[mutant]
    for before, after in edits:
        assert source.count(before) == 1
        source = source.replace(before, after)
    found = _explore(4, 2, _consumer_parts(source, between))
    assert found is not None and (found[0], found[2]) == (fault, detail)


@pytest.mark.parametrize("block_m, block_k, slices", [(1, 64, 1), (16, 128, 1), (1, 64, 4)])
def test_the_merge_streams_its_first_weight_tile_before_the_wait_on_sm90(
    task, block_m, block_k, slices
) -> None:
    """Compiled for sm_90: the first W_UV tile's loads (evict-first 16-byte vectors) come before
    griddepcontrol.wait, the partials and their log-sum-exp after it, the output last; the
    kernel after it is not let launch early. In column slices, the count comes after the wait,
    and after a barrier behind the slice's stores."""
    module = candidate_module(task, GLUON)
    types = {"po_ptr": "*fp32", "plse_ptr": "*fp32", "w_ptr": "*bf16", "y_ptr": "*bf16"}
    types |= {"sum_ptr": "*fp32", "count_ptr": "*i32"}
    types |= dict.fromkeys(("B", "H", "n_splits"), "i32")
    constexprs = {"R": 512, "DV": 128, "BLOCK_M": block_m, "BLOCK_S": 64, "BLOCK_K": block_k}
    constexprs |= {"USE_DOT": block_m >= 16, "PDL": True, "COLUMN_SLICES": slices}
    ptx = hopper_ptx(module._merge_value_kernel, types, constexprs, 4)
    vectors = 128 * block_k * 2 // 16 // (32 * 4)
    assert_weights_stream_before_the_wait(ptx, vectors, triggers=False, later_weights=True)
    if slices > 1:  # every thread's product stored, then a barrier, then the count
        after_wait = ptx.partition("griddepcontrol.wait")[2]
        arrive = after_wait.index("atom.global.gpu.acq_rel.add")
        assert "bar.sync" in after_wait[after_wait.rindex("st.global", 0, arrive) : arrive]


# The merge-and-project kernel under the interpreter, in a Python of its own: the reference cut
# by hand into 37 splits (partials and their log2-sum-exp) for 2 sequences of 3 heads, merged
# and projected one sequence a program on the CUDA cores and 16 a program on tensor cores (the
# rows past 2 masked), whole rows and in column slices; the kernel file given as the first
# argument.
MERGE_VALUE = """
import json, math, sys
import torch
from tests.source_files import import_file
from pathlib import Path

module = import_file(Path(sys.argv[1]))
gen = torch.Generator().manual_seed(3)
b, h, n, r, dv, splits = 2, 3, 37 * 4, 64, 16, 37
qn, qp, ckv, kpe = (torch.randn(s, generator=gen, dtype=torch.float64)
                    for s in ((b, h, r), (b, h, 8), (b, n, r), (b, n, 8)))
w = torch.randn(h, dv, r, generator=gen, dtype=torch.float64) / math.sqrt(r)
scores = (qn @ ckv.transpose(1, 2) + qp @ kpe.transpose(1, 2)) / math.sqrt(192)
want = torch.einsum("bhc,hdc->bhd", torch.softmax(scores, -1) @ ckv, w)
parts = scores.view(b, h, splits, n // splits) * math.log2(math.e)
lse = torch.logsumexp(parts / math.log2(math.e), -1) * math.log2(math.e)
weights = torch.exp2(parts - lse[..., None])
po = torch.einsum("bhst,bstr->bhsr", weights, ckv.view(b, splits, n // splits, r))
errors, counts_after = [], []
for block_m, block_k, slices in ((1, 32, 1), (16, 16, 1), (16, 16, 2), (1, 8, 4)):
    out = torch.empty(b, h, dv, dtype=torch.float32)
    tiles = -(-b // block_m) * h
    sums = torch.full((tiles * slices * block_m * dv,), float("nan"))
    counts = torch.zeros(tiles, dtype=torch.int32)
    for _ in range(2):  # a second call finds the counts reset by the first
        module._merge_value_kernel[(-(-b // block_m), h, slices)](
            po.float().contiguous(), lse.float().contiguous(), w.float().contiguous(), out,
            sums, counts, b, h, splits, R=r, DV=dv, BLOCK_M=block_m, BLOCK_S=64,
            BLOCK_K=block_k, USE_DOT=block_m >= 16, PDL=False, COLUMN_SLICES=slices)
        errors.append(float((out.double() - want).abs().max()))
        out.fill_(float("nan"))
    counts_after.append(int(counts.abs().sum()))
print(json.dumps({"errors": errors, "counts_after": counts_after}))
"""


# The runs of MERGE_VALUE: two calls each of whole rows on the CUDA cores and on tensor cores,
# then of rows cut into 2 column slices (tensor cores) and 4 (CUDA cores), two steps a slice.
WHOLE_ROWS, SLICED = range(4), range(4, 8)


def test_the_merge_weights_the_splits_and_projects_each_head(task) -> None:
    """Whole rows a program, and rows cut into column slices added up by the last slice to
    arrive, twice each: every run right (a NaN, from an output left unwritten, fails), and the
    counts back at zero after every call. (The interpreter runs programs in order, so the last
    to arrive is the last slice; the GPU tests run them as the hardware schedules them.)"""
    got = json.loads(run_interpreted(MERGE_VALUE, str(task.folder / GLUON)))
    assert len(got["errors"]) == 8 and all(e < 1e-4 for e in got["errors"]), got
    assert got["counts_after"] == [0, 0, 0, 0]


@pytest.mark.parametrize(
    "bug, runs",
    [
        (  # every head projected by head 0's weight
            (
                "w_rows = w_ptr + head.to(tl.int64) * DV * R + dv[:, None] * R",
                "w_rows = w_ptr + dv[:, None] * R",
            ),
            [*WHOLE_ROWS, *SLICED],
        ),
        (  # the splits' weights not normalised by their sum
            ("weights / tl.sum(weights, axis=1)[:, None], 0.0)", "weights, 0.0)"),
            [*WHOLE_ROWS, *SLICED],
        ),
        (  # every column slice starts at column 0
            ("col0 = tl.program_id(2) * slice_cols", "col0 = tl.program_id(2) * 0"),
            SLICED,
        ),
        (  # every slice stores its product into the first slice's place
            (
                "tl.store(tile_sums + tl.program_id(2) * (BLOCK_M * DV), acc)",
                "tl.store(tile_sums, acc)",
            ),
            SLICED,
        ),
    ],
    ids=["head-0-weight", "unnormalised", "slices-overlap", "slices-one-place"],
)
def test_a_mutant_merge_is_caught(task, tmp_path, bug, runs) -> None:
    """Each mutant is wrong (or NaN) in every run it touches: all of them, or the sliced ones
    for the slices' own mutants."""
    buggy = mutated(task.folder / GLUON, *bug, tmp_path / "bug.py")
    errors = json.loads(run_interpreted(MERGE_VALUE, str(buggy)))["errors"]
    assert all(not errors[i] < 1e-2 for i in runs), errors


@pytest.mark.gpu
def test_the_gluon_candidate_matches_the_reference_on_gpu(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            (GLUON, {}),
            (GLUON, {"block_m": 16, "block_k": 64, "merge_stages": 1}),
            (GLUON, {"block_k": 128, "merge_warps": 8, "merge_stages": 2}),
            (GLUON, {"block_k": 32, "merge_stages": 4}),
            (GLUON, {"block_n": 64, "num_stages": 2, "block_k": 32}),
            (GLUON, {"column_slices": 4}),
            (GLUON, {"block_m": 16, "block_k": 32, "column_slices": 8}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)
    assert math.isfinite(max(s.rel_err for s in ev.verdicts[0].shapes.values()))


@pytest.mark.gpu
def test_the_cuda_candidate_matches_the_reference_on_gpu(task) -> None:
    """At every task shape (splits of 1 to 128 tiles among them), in both builds (the 64-row one
    with the other's value product between the score groups too), and merges on CUDA cores, in
    column slices and on tensor cores."""
    # 64 splits at b1-kv4096 in either build: one 64-column step at a time fits shared memory
    tensor_cores = {"block_m": 16, "block_k": 64, "merge_stages": 1}
    rows64 = {"block_n": 64, "num_stages": 2}
    ev = gpu_evaluate(
        task,
        [
            (CUDA, {}),
            (CUDA, {"block_k": 128, "column_slices": 4}),
            (CUDA, tensor_cores),
            (CUDA, rows64),
            (CUDA, rows64 | tensor_cores),
            (CUDA, rows64 | {"values_between": True}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


@pytest.mark.gpu
@pytest.mark.parametrize("values_between", [False, True])
@pytest.mark.parametrize("block_n, num_stages", [(32, 4), (64, 2)])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 5, 10])
def test_the_cuda_candidate_in_one_split_of_a_few_tiles(
    task, monkeypatch, n_tiles, block_n, num_stages, values_between
) -> None:
    """One sequence of 64 heads in a single split of 1, 2, 3, 5 and 10 tiles (the split rule
    replaced so that one program takes them all), in every build and either loop: each
    warpgroup's start and end with no, one and several turns of the loop between, and the ring
    wrapping."""
    module = candidate_module(task, CUDA)
    monkeypatch.setattr(module, "split_tiles", lambda programs, tiles, sms: tiles)
    kv_len = n_tiles * block_n
    shape = {**task.shapes("cuda")[0].to_dict(), "batch": 1, "heads": 64, "kv_len": kv_len}
    inputs = task.module.make_inputs(shape, 3, "cuda")
    want = task.reference(*inputs)
    got = module.kernel(
        *inputs, block_n=block_n, num_stages=num_stages, values_between=values_between
    ).double()
    assert float((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("block_n, num_stages", [(32, 4), (64, 2)])
def test_the_cuda_candidates_two_loops_give_the_same_bits(task, block_n, num_stages) -> None:
    """values_between reorders the products, not the arithmetic: the same output, bit for bit,
    at 16 sequences of 4096 keys (several tiles a split, the loop turning)."""
    module = candidate_module(task, CUDA)
    shape = next(s for s in task.shapes("cuda") if s.name == "b16-kv4096")
    inputs = task.make_inputs(shape, 11, "cuda")
    first, between = (
        module.kernel(*inputs, block_n=block_n, num_stages=num_stages, values_between=flag)
        for flag in (False, True)
    )
    assert first.abs().amax() > 0
    assert torch.equal(first, between)


@pytest.mark.gpu
def test_the_cuda_candidate_where_the_maxima_keep_rising(task) -> None:
    """Keys scaled up along the cache (position j by 1 + j / 64): a later tile's scores exceed
    the running maximum time and again, so O is rescaled by a factor well below one mid-split,
    not only at a split's start."""
    module = candidate_module(task, CUDA)
    shape = next(s for s in task.shapes("cuda") if s.name == "b16-kv4096")
    q_nope, q_pe, ckv, kpe, w_uv = task.make_inputs(shape, 5, "cuda")
    rise = 1 + torch.arange(ckv.shape[1], device="cuda") / 64
    ckv, kpe = (x * rise[None, :, None].to(x.dtype) for x in (ckv, kpe))
    inputs = (q_nope, q_pe, ckv.contiguous(), kpe.contiguous(), w_uv)
    want = task.reference(*inputs)
    got = module.kernel(*inputs, block_m=16, block_k=128, merge_warps=8).double()
    assert float((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.gpu
def test_a_merge_too_big_for_shared_memory_is_refused_naming_why(task) -> None:
    """On tensor cores at one sequence (64 splits a head), 64-column steps 3 stages deep would
    take 546 KiB of shared memory: Triton's refusal to launch comes back as a ValueError that
    says what to change."""
    module = candidate_module(task, GLUON)
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    inputs = task.make_inputs(shape, 7, "cuda")
    with pytest.raises(ValueError, match=r"over 64 splits .*Required: 559104.*try block_m 1 or"):
        module.kernel(*inputs, block_m=16, block_k=64)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape_name, params",
    [
        ("b1-kv4096", {}),
        ("b1-kv4096", {"column_slices": 4}),
        ("b16-kv4096", {"block_m": 16, "block_k": 128, "merge_warps": 8}),
    ],
)
@pytest.mark.parametrize("name", [GLUON, CUDA])
def test_both_kernels_wait_for_the_kernel_that_writes_their_inputs(
    task, name, shape_name, params
) -> None:
    """Launched with programmatic dependent launch right after a kernel that writes one input
    2 ms late (each of the five in turn, W_UV too, whose first tile the merge loads before its
    wait), the output is the reference's: one sequence at one program a head and at four column
    slices a head, and 16 sequences on tensor cores (the tables' configurations)."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, name)
    shape = next(s for s in task.shapes("cuda") if s.name == shape_name)
    inputs = task.make_inputs(shape, 7, "cuda")
    want = task.reference(*(t.double() for t in inputs))
    assert_waits_for_late_inputs(lambda *t: module.kernel(*t, **params), tuple(inputs), want)

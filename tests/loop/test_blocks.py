"""Decoder blocks on the CPU with tiny configs: eager output, tuned ops from dispatch tables
pointing at the shipped torch candidates, peer and missing-table fallbacks, decode/prefill
agreement, and the streamed-bytes arithmetic."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch

from loop import blocks
from loop.blocks import (
    LlamaConfig,
    MlaConfig,
    bytes_streamed,
    compiled_block,
    decoder_block,
    eager_ops,
    make_inputs,
    make_weights,
    param_count,
    stacked_block,
    tuned_ops,
)
from loop.tasks import load_task

LLAMA = LlamaConfig(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96)
MLA = MlaConfig(
    hidden=64, heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_dim=16, rope_dim=8,
    v_head_dim=16, ffn=96,
)  # fmt: skip
CONFIGS = [LLAMA, MLA]
SIZES = {"decode": (2, 19), "prefill": (2, 12)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _run(cfg, ops, mode: str, seed: int = 1) -> tuple[torch.Tensor, ...]:
    block = decoder_block(cfg, make_weights(cfg, "cpu", seed=0), ops)
    return getattr(block, mode)(*make_inputs(cfg, mode, *SIZES[mode], device="cpu", seed=seed))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_eager_block_outputs_are_finite_and_shaped(cfg) -> None:
    out, *new = _run(cfg, eager_ops(), "decode")
    assert out.shape == (2, cfg.hidden) and torch.isfinite(out).all()
    assert 0.1 < float(out.std()) < 10
    if cfg.kind == "llama":
        assert [tuple(t.shape) for t in new] == [(2, cfg.kv_heads, cfg.head_dim)] * 2
    else:
        assert [tuple(t.shape) for t in new] == [(2, cfg.kv_lora_rank), (2, cfg.rope_dim)]
    (pre,) = _run(cfg, eager_ops(), "prefill")
    assert pre.shape == (2, 12, cfg.hidden) and torch.isfinite(pre).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_decode_of_the_last_token_matches_prefill(cfg) -> None:
    """The decode step over a cache of the prompt's own entries gives the prefill's last row:
    checks the cache layout, rope positions, GQA grouping and MLA's weight absorption."""
    t = 9
    block = decoder_block(cfg, make_weights(cfg, "cpu", seed=3), eager_ops())
    x, cos, sin = make_inputs(cfg, "prefill", 1, t, seed=4)
    (pre,) = block.prefill(x, cos, sin)
    _, dummy_a, dummy_b, _, _ = make_inputs(cfg, "decode", 1, 1, seed=5)
    entries = [
        block.decode(x[:, i], dummy_a, dummy_b, cos[i : i + 1], sin[i : i + 1]) for i in range(t)
    ]
    if cfg.kind == "llama":
        k_cache = torch.stack([e[1] for e in entries], dim=2)
        v_cache = torch.stack([e[2] for e in entries], dim=2)
    else:
        k_cache = torch.stack([e[1] for e in entries], dim=1)
        v_cache = torch.stack([e[2] for e in entries], dim=1)
    out = block.decode(x[:, -1], k_cache, v_cache, cos[-1:], sin[-1:])[0]
    assert _rel(out, pre[:, -1]) < 1e-5


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_a_chunk_of_a_prompt_over_its_cache_matches_the_prompts_prefill(cfg) -> None:
    """A chunked prefill step over a cache of the prompt's own entries gives the prefill's rows
    of the chunk's tokens: checks the causal mask (the chunk is the cache's last tokens), the
    chunk's rope positions and the cache layout (MLA's: the latent and rope key a token)."""
    n, t = 12, 5
    block = decoder_block(cfg, make_weights(cfg, "cpu", seed=3), eager_ops())
    x, cos, sin = make_inputs(cfg, "prefill", 2, n, seed=4)
    (pre,) = block.prefill(x, cos, sin)
    chunk_x, any_a, any_b, chunk_cos, chunk_sin = make_inputs(cfg, "chunk", 2, n, tokens=t)
    llama = cfg.kind == "llama"
    entry = (LLAMA.kv_heads, n, 16) if llama else (n, cfg.kv_lora_rank)
    assert chunk_x.shape == (2, t, cfg.hidden) and any_a.shape == (2, *entry)
    assert torch.equal(chunk_cos, cos[n - t :]) and torch.equal(chunk_sin, sin[n - t :])
    _, a, b = block.chunk(x, any_a, any_b, cos, sin)  # the prompt's entries: not from the cache
    cache_a, cache_b = (a.transpose(1, 2), b.transpose(1, 2)) if llama else (a, b)
    out, a_new, b_new = block.chunk(x[:, n - t :], cache_a, cache_b, cos[n - t :], sin[n - t :])
    assert _rel(out, pre[:, n - t :]) < 1e-5
    assert _rel(a_new, a[:, n - t :]) < 1e-6 and _rel(b_new, b[:, n - t :]) < 1e-6
    # the whole prompt as one chunk is its prefill
    assert _rel(block.chunk(x, cache_a, cache_b, cos, sin)[0], pre) < 1e-5


@pytest.mark.parametrize(
    ("cfg", "mode", "tokens", "message"),
    [
        (LLAMA, "decode", 4, "tokens is given with mode 'chunk' only"),
        (LLAMA, "chunk", None, "tokens is given with mode 'chunk' only"),
        (LLAMA, "chunk", 0, "tokens must be a positive integer, got 0"),
        (LLAMA, "chunk", 9, "a chunk of 9 tokens is longer than its prompt"),
        (MLA, "chunk", 9, "a chunk of 9 tokens is longer than its prompt"),
    ],
)
def test_bad_chunk_inputs_are_refused(cfg, mode: str, tokens, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_inputs(cfg, mode, 1, 8, tokens=tokens)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_a_tuned_chunk_runs_its_tables_attention_eagerly_and_compiled(cfg, tmp_path) -> None:
    """The chunk's attention (5 queries onto 12 keys; Llama's GQA expanded, MLA's key and value
    expanded from the latent, v narrower than q and k) goes to the prefill attention table's
    candidate at those dims, and matches the eager chunk, compiled too."""
    task, dims = _prefill_attention_dims(cfg, 2)
    dims.update({"q_len": 5, "kv_len": 12, "dtype": "float32"})
    entry = {"shape": "s0", "dims": dims, "source": "candidate", "name": f"torch_{task}.py"}
    entry.update({"params": {"chunk": 4}, "commit": "", "speedup": None})
    _write_tables(tmp_path, {task: [entry]})
    weights = make_weights(cfg, "cpu", seed=0)
    ops = tuned_ops(tmp_path, "cpu")
    tuned = decoder_block(cfg, weights, ops)
    eager = decoder_block(cfg, weights, eager_ops())
    inputs = make_inputs(cfg, "chunk", 2, 12, seed=1, tokens=5)
    want = eager.chunk(*inputs)
    graphs, keep_graph = _graph_keeper()
    for block in (tuned, compiled_block(tuned, backend=keep_graph)):
        for got, w in zip(block.chunk(*inputs), want, strict=True):
            assert _rel(got, w) < 1e-5
    assert len(graphs) == 1
    assert any(f"torch_{task}.py" in n for n in ops.notes), ops.notes
    assert not any("refused" in n or "eager" in n for n in ops.notes), ops.notes


# Every op's task, with dims of the tiny configs and params of the shipped torch candidate: the
# fused norm-into-linear and linear-plus-residual tasks in place of the rmsnorm, add_rmsnorm and
# skinny_gemm ones they make unused (`fused`), or without them (then the MLP's add and norm run
# as add_rmsnorm); with `epilogues`, SwiGLU (and Llama's rope) folded into the projections
# before them too (rmsnorm_linear_swiglu, rmsnorm_linear_rope), MLA's rope and latent norm
# after them (mla_rope_norm) and its attention with the value projection (mla_decode_value), and
# Llama's decode attention with the output projection and its add (gqa_decode_residual).
def _prefill_attention_dims(cfg, batch: int) -> tuple[str, dict]:
    """The prefill attention's task and dims but the lengths: MLA's expanded form has q and k
    of nope + rope dims and a narrower v."""
    if cfg.kind == "llama":
        return "prefill_attention", {"batch": batch, "heads": cfg.heads, "head_dim": cfg.head_dim}
    dims = {"batch": batch, "heads": cfg.heads, "head_dim": cfg.qk_nope_dim + cfg.rope_dim}
    return "mla_prefill_attention", {**dims, "v_head_dim": cfg.v_head_dim}


def _entries(cfg, mode: str, fused: bool = True, epilogues: bool = False) -> dict[str, list[dict]]:
    b, n = SIZES[mode]
    rows = b if mode == "decode" else b * n
    dt = {"dtype": "float32"}
    gate_up, down = (2 * cfg.ffn, cfg.hidden), (cfg.hidden, cfg.ffn)
    if cfg.kind == "llama":
        heads, head_dim = [cfg.heads + cfg.kv_heads], cfg.head_dim  # q's and k's in one call
        normed = [((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, cfg.hidden)]  # qkv
        o = (cfg.hidden, cfg.heads * cfg.head_dim)
        hiddens = [cfg.hidden]
    else:
        heads, head_dim = [cfg.heads, 1], cfg.rope_dim
        normed = [
            (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.rope_dim, cfg.hidden),  # q_a and kv_a
            (cfg.heads * (cfg.qk_nope_dim + cfg.rope_dim), cfg.q_lora_rank),  # q_b
        ]
        o = (cfg.hidden, cfg.heads * cfg.v_head_dim)
        hiddens = [cfg.hidden, cfg.q_lora_rank, cfg.kv_lora_rank]

    def gemm_rows(weights: list[tuple[int, int]]) -> list[tuple[dict, dict]]:
        return [({"m": rows, "n": nn, "k": k, **dt}, {"chunk_n": 16}) for nn, k in weights]

    out = {
        "rmsnorm": [
            ({"tokens": rows, "hidden": h, **dt}, {"method": "vector_norm", "chunk_rows": 0})
            for h in hiddens
        ],
        "add_rmsnorm": [({"tokens": rows, "hidden": cfg.hidden, **dt}, {"sum_dtype": "input"})],
        "rope": [
            ({"tokens": rows, "heads": h, "head_dim": head_dim, **dt}, {"compute": "input"})
            for h in heads
        ],
        "swiglu": [({"tokens": rows, "ffn": cfg.ffn, **dt}, {"compute": "input"})],
        "skinny_gemm": gemm_rows([*normed, o, gate_up, down]),
    }
    if fused:
        del out["skinny_gemm"], out["add_rmsnorm"]
        out["rmsnorm"] = out["rmsnorm"][2:]  # MLA's kv_norm is the only norm left on its own
        if not out["rmsnorm"]:
            del out["rmsnorm"]
        out["rmsnorm_linear"] = gemm_rows([*normed, gate_up])
        out["linear_residual"] = gemm_rows([o, down])
        if epilogues:
            del out["swiglu"], out["rmsnorm_linear"][-1]
            mlp = {"m": rows, "f": cfg.ffn, "k": cfg.hidden, **dt}
            out["rmsnorm_linear_swiglu"] = [(mlp, {"chunk_f": 16})]
        if epilogues and cfg.kind == "llama":
            del out["rope"], out["rmsnorm_linear"]
            n_qk, n_v = (cfg.heads + cfg.kv_heads) * cfg.head_dim, cfg.kv_heads * cfg.head_dim
            attn = {"m": rows, "n_qk": n_qk, "n_v": n_v, "head_dim": cfg.head_dim}
            out["rmsnorm_linear_rope"] = [({**attn, "k": cfg.hidden, **dt}, {"chunk_n": 16})]
        if epilogues and cfg.kind == "mla":
            del out["rope"], out["rmsnorm"]
            dims = {"tokens": rows, "heads": cfg.heads, "nope_dim": cfg.qk_nope_dim}
            dims.update({"rope_dim": cfg.rope_dim, "kv_lora_rank": cfg.kv_lora_rank, **dt})
            out["mla_rope_norm"] = [(dims, {"compute": "input"})]
    if cfg.kind == "llama" and mode == "decode":
        dims = {"batch": b, "q_heads": cfg.heads, "kv_heads": cfg.kv_heads}
        dims.update({"head_dim": cfg.head_dim, "kv_len": n, **dt})
        out["gqa_decode"] = [(dims, {"chunk": 8})]
        if epilogues:  # the attention, the output projection and its add in one op
            del out["gqa_decode"]
            out["gqa_decode_residual"] = [({**dims, "hidden": cfg.hidden}, {"chunk": 8})]
    if mode == "prefill":
        task, dims = _prefill_attention_dims(cfg, b)
        dims.update({"q_len": n, "kv_len": n, **dt})
        out[task] = [(dims, {"chunk": 4})]
    if cfg.kind == "mla" and mode == "decode":
        dims = {"batch": b, "heads": cfg.heads, "kv_lora_rank": cfg.kv_lora_rank}
        dims.update({"rope_dim": cfg.rope_dim, "kv_len": n, **dt})
        out["mla_decode"] = [(dims, {"chunk": 8})]
        absorbed = [(cfg.kv_lora_rank, cfg.qk_nope_dim), (cfg.v_head_dim, cfg.kv_lora_rank)]
        out["head_gemv"] = [
            ({"batch": b, "heads": cfg.heads, "n": nn, "k": k, **dt}, {"chunk_heads": 1})
            for nn, k in absorbed
        ]
        if epilogues:  # the attention and its value projection in one op
            del out["mla_decode"], out["head_gemv"][1]
            out["mla_decode_value"] = [({**dims, "v_head_dim": cfg.v_head_dim}, {"chunk": 8})]
    return {
        task: [
            {
                "shape": f"m{d['m']}" if "m" in d else f"s{i}",
                "dims": d,
                "source": "candidate",
                "name": f"torch_{task}.py",
                "params": p,
                "commit": "",
                "speedup": None,
            }
            for i, (d, p) in enumerate(pairs)
        ]
        for task, pairs in out.items()
    }


_BUCKETS = {
    "rmsnorm": "tokens",
    "add_rmsnorm": "tokens",
    "rope": "tokens",
    "swiglu": "tokens",
    "skinny_gemm": "m",
    "rmsnorm_linear": "m",
    "linear_residual": "m",
    "rmsnorm_linear_swiglu": "m",
    "rmsnorm_linear_rope": "m",
    "mla_rope_norm": "tokens",
    "mla_decode_value": "kv_len",
    "gqa_decode": "kv_len",
    "gqa_decode_residual": "kv_len",
    "prefill_attention": "kv_len",
    "mla_prefill_attention": "kv_len",
    "mla_decode": "kv_len",
    "head_gemv": "batch",
}


def _write_tables(folder: Path, entries: dict[str, list[dict]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for task, rows in entries.items():
        table = {"task": task, "bucket_key": _BUCKETS[task], "entries": rows}
        (folder / f"dispatch-{task}.json").write_text(json.dumps(table))


@pytest.mark.parametrize(
    "fused,epilogues",
    [(True, False), (True, True), (False, False)],
    ids=["fused", "epilogues", "unfused"],
)
@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_tuned_torch_candidates_match_eager(
    cfg, mode: str, fused: bool, epilogues: bool, tmp_path: Path
) -> None:
    """Every table the block's ops read is used; without the fused tables, the fused ops
    compose the tuned unfused ones."""
    entries = _entries(cfg, mode, fused, epilogues)
    _write_tables(tmp_path, entries)
    ops = tuned_ops(tmp_path, "cpu")
    tuned = _run(cfg, ops, mode)
    eager = _run(cfg, eager_ops(), mode)
    for t, e in zip(tuned, eager, strict=True):
        assert _rel(t, e) < 1e-5
    used = "\n".join(ops.notes)
    for task in entries:
        assert f"torch_{task}.py" in used, used
    assert "eager" not in used.replace("tuned ops are the eager", ""), used


def _graph_keeper() -> tuple[list, object]:
    """A torch.compile backend that runs each graph as traced, and the list it keeps them in."""
    graphs: list = []

    def keep_graph(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, keep_graph


def _compiled_against_eager(cfg, entries: dict, folder: Path, monkeypatch):
    """The tuned block over `entries`' tables, run eagerly (its calls to the opaque op kept)
    and under torch.compile (its one graph's call targets kept); asserts the compiled block
    matches the eager one in one graph. Returns (calls, targets)."""
    _write_tables(folder, entries)
    graphs, keep_graph = _graph_keeper()
    weights = make_weights(cfg, "cpu", seed=0)
    inputs = make_inputs(cfg, "decode", *SIZES["decode"], device="cpu", seed=1)
    calls = []
    opaque_op = blocks._tuned_kernel
    with monkeypatch.context() as m:
        m.setattr(blocks, "_tuned_kernel", lambda *a: calls.append(a) or opaque_op(*a))
        decoder_block(cfg, weights, tuned_ops(folder, "cpu")).decode(*inputs)
    tuned = decoder_block(cfg, weights, tuned_ops(folder, "cpu"))
    got = compiled_block(tuned, backend=keep_graph).decode(*inputs)
    want = decoder_block(cfg, weights, eager_ops()).decode(*inputs)
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) < 1e-5
    assert len(graphs) == 1, "the tuned block compiled with graph breaks"
    return calls, [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_compiled_tuned_block_keeps_candidates_opaque_and_traces_peers(
    cfg, tmp_path, monkeypatch
) -> None:
    """Under torch.compile, each op a candidate wins is one opaque call in the graph (the
    compiler fuses around it) and an op a peer wins is traced like the eager block's."""
    entries = _entries(cfg, "decode")
    for row in entries["swiglu"]:
        row.update(source="peer", name="torch.compile", params={})
    calls, targets = _compiled_against_eager(cfg, entries, tmp_path, monkeypatch)
    # as many opaque calls as the eager tuned block makes to candidates (every op but swiglu)
    assert sum("tuned_kernel" in t for t in targets) == len(calls) >= len(entries) - 1
    assert "silu" in " ".join(targets), "the peer-won swiglu was not traced"


def test_with_one_of_the_mlp_fusions_the_other_composes_and_add_rmsnorm_is_not_used(
    tmp_path: Path,
) -> None:
    """The output projection's add fused, the MLP's norm not: the norm runs on its own (tuned)
    and the add_rmsnorm table goes unused; without either, add_rmsnorm does both."""
    fused, unfused = _entries(LLAMA, "decode"), _entries(LLAMA, "decode", fused=False)
    tables = {**unfused, "linear_residual": fused["linear_residual"]}
    _write_tables(tmp_path, tables)
    ops = tuned_ops(tmp_path, "cpu")
    tuned = _run(LLAMA, ops, "decode")
    eager = _run(LLAMA, eager_ops(), "decode")
    for t, e in zip(tuned, eager, strict=True):
        assert _rel(t, e) < 1e-5
    used = "\n".join(ops.notes)
    assert "torch_linear_residual.py" in used and "torch_rmsnorm.py" in used, used
    assert "add_rmsnorm" not in used, used
    assert not eager_ops().is_kernel("linear_residual", *tuned[:1])


def test_peer_entry_falls_back_to_eager(tmp_path: Path) -> None:
    entries = _entries(LLAMA, "decode", fused=False)
    for row in entries["rmsnorm"]:
        row.update(source="peer", name="torch.compile", params={})
    _write_tables(tmp_path, {"rmsnorm": entries["rmsnorm"]})
    ops = tuned_ops(tmp_path, "cpu")
    tuned = _run(LLAMA, ops, "decode")
    eager = _run(LLAMA, eager_ops(), "decode")
    assert all(torch.equal(t, e) for t, e in zip(tuned, eager, strict=True))
    assert any("peer 'torch.compile' wins, eager" in n for n in ops.notes), ops.notes


def test_two_peers_winning_at_call_sites_of_one_op_compile_into_one_graph(tmp_path) -> None:
    """cuBLAS kept at one projection and eager at the others, compiled with no eager run before:
    every choice the compiler traces must be readable when the first call site is traced."""
    rows = _entries(LLAMA, "decode", fused=False)["skinny_gemm"]
    for i, row in enumerate(rows):
        row.update(source="peer", name="cublas" if i == 2 else "eager", params={})
    _write_tables(tmp_path, {"skinny_gemm": rows})
    graphs, keep_graph = _graph_keeper()
    weights = make_weights(LLAMA, "cpu", seed=0)
    inputs = make_inputs(LLAMA, "decode", *SIZES["decode"], device="cpu", seed=1)
    ops = tuned_ops(tmp_path, "cpu")
    got = compiled_block(decoder_block(LLAMA, weights, ops), backend=keep_graph).decode(*inputs)
    want = decoder_block(LLAMA, weights, eager_ops()).decode(*inputs)
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) < 1e-5
    assert len(graphs) == 1, "the tuned block compiled with graph breaks"
    assert any("peer 'cublas' wins, the task's cublas" in n for n in ops.notes), ops.notes


def test_blocks_compiled_from_two_tables_get_their_own_graphs(tmp_path: Path) -> None:
    """The kernel an op resolved to is a constant of the traced graph: a block built from another
    table (here: the eager peer everywhere) must compile its own graph, not reuse the first."""
    with_candidates, with_peers = tmp_path / "a", tmp_path / "b"
    _write_tables(with_candidates, _entries(LLAMA, "decode"))
    entries = _entries(LLAMA, "decode")
    for rows in entries.values():
        for row in rows:
            row.update(source="peer", name="eager", params={})
    _write_tables(with_peers, entries)
    graphs, keep_graph = _graph_keeper()

    def opaque_calls(gm) -> int:
        return sum("tuned_kernel" in str(n.target) for n in gm.graph.nodes)

    weights = make_weights(LLAMA, "cpu", seed=0)
    inputs = make_inputs(LLAMA, "decode", *SIZES["decode"], device="cpu", seed=1)
    for folder in (with_candidates, with_peers):
        block = decoder_block(LLAMA, weights, tuned_ops(folder, "cpu"))
        compiled_block(block, backend=keep_graph).decode(*inputs)
    assert len(graphs) == 2, "the second table's block reused the first one's graph"
    assert opaque_calls(graphs[0]) > 0
    assert opaque_calls(graphs[1]) == 0


def _git_commit_file(repo: Path, relative: str, text: str) -> str:
    (repo / relative).parent.mkdir(parents=True, exist_ok=True)
    (repo / relative).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "edit")
    return _git(repo, "rev-parse", "HEAD")


def _ops_of_workspace_candidate(tmp_path: Path, task: str, name: str, source: str):
    """Tuned ops whose only table, `task`'s rows of the MLA decode block (unfused where the
    block composes `task`), names `source`, committed to a run workspace as `task`/`name`."""
    commit = _git_commit_file(tmp_path / "workspace" / "study", f"{task}/{name}", source)
    rows = _entries(MLA, "decode", fused=False)[task]
    for row in rows:
        row.update(name=name, params={}, commit=commit)
    _write_tables(tmp_path, {task: rows})
    return tuned_ops(tmp_path, "cpu")


def _assert_mla_decodes_as_eager(ops, compiled: bool) -> None:
    """The MLA decode block on `ops` (compiled with aot_eager where asked) gives the eager
    block's outputs."""
    weights = make_weights(MLA, "cpu", seed=0)
    inputs = make_inputs(MLA, "decode", *SIZES["decode"], device="cpu", seed=1)
    block = decoder_block(MLA, weights, ops)
    if compiled:
        block = compiled_block(block, backend="aot_eager")
    got = block.decode(*inputs)
    want = decoder_block(MLA, weights, eager_ops()).decode(*inputs)
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) < 1e-5


HALVES_OF_ONE_BUFFER = """
import torch

LANGUAGE = "torch"


def kernel(x, residual, weight):
    both = torch.empty((2, *x.shape), dtype=x.dtype, device=x.device)
    torch.add(x, residual, out=both[1])
    h = both[1].float()
    both[0].copy_(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float())
    return both[0], both[1]
"""


@pytest.mark.parametrize("compiled", [False, True], ids=["tuned", "compiled-tuned"])
def test_a_kernel_whose_outputs_share_one_buffer_runs_in_the_block(compiled, tmp_path) -> None:
    """The evaluator accepts two outputs that are views of one buffer; the opaque op must too."""
    # unfused: the MLP's add and norm
    ops = _ops_of_workspace_candidate(tmp_path, "add_rmsnorm", "halves.py", HALVES_OF_ONE_BUFFER)
    _assert_mla_decodes_as_eager(ops, compiled)
    assert any("halves.py (workspace commit)" in n for n in ops.notes), ops.notes


# A head_gemv kernel that refuses a contiguous query (k = QK_NOPE: a copy of the block's slice).
VIEWS_ONLY = """
import torch

LANGUAGE = "torch"
STRIDED_INPUTS = True


def kernel(x, w):
    if x.shape[-1] == QK_NOPE and x.is_contiguous():
        raise ValueError("given a copy")
    return torch.einsum("bhk,hnk->bhn", x, w)
"""


@pytest.mark.parametrize("compiled", [False, True], ids=["tuned", "compiled-tuned"])
@pytest.mark.parametrize("declared", [True, False])
def test_only_a_candidate_that_declares_strided_inputs_gets_the_blocks_views(
    declared, compiled, tmp_path
) -> None:
    """The block passes its views as they are to a candidate whose STRIDED_INPUTS is True, and
    copies to any other (the task's contract): here the query slice (a head's qk_nope columns
    of its qk_nope + rope), which the kernel above refuses as a copy."""
    source = VIEWS_ONLY.replace("STRIDED_INPUTS = True", f"STRIDED_INPUTS = {declared}")
    source = source.replace("QK_NOPE", str(MLA.qk_nope_dim))
    assert MLA.qk_nope_dim != MLA.kv_lora_rank  # the second projection's k
    ops = _ops_of_workspace_candidate(tmp_path, "head_gemv", "views.py", source)
    _assert_mla_decodes_as_eager(ops, compiled)
    refused = [n for n in ops.notes if "views.py refused the inputs (given a copy)" in n]
    assert bool(refused) is not declared, ops.notes


def _decode_with_one_table(tmp_path: Path, cfg, task: str, **entry):
    """A decode block whose only table is `task`'s, every entry updated with `entry`: its ops,
    its outputs and the eager block's."""
    rows = _entries(cfg, "decode")[task]
    for row in rows:
        row.update(entry)
    _write_tables(tmp_path, {task: rows})
    ops = tuned_ops(tmp_path, "cpu")
    return ops, _run(cfg, ops, "decode"), _run(cfg, eager_ops(), "decode")


def test_a_vendor_peer_that_wins_runs_instead_of_the_eager_op(tmp_path: Path) -> None:
    """Where SDPA with enable_gqa beat the candidates, the block runs it, not its own eager
    attention (which expands the cache to the query heads)."""
    task = load_task("gqa_decode")
    if "sdpa-gqa" not in task.module.PEERS:
        pytest.skip("this torch's SDPA has no enable_gqa")
    ops, tuned, eager = _decode_with_one_table(
        tmp_path, LLAMA, "gqa_decode", source="peer", name="sdpa-gqa", params={}
    )
    for t, e in zip(tuned, eager, strict=True):
        assert _rel(t, e) < 1e-5
    assert any("peer 'sdpa-gqa' wins, the task's sdpa-gqa" in n for n in ops.notes), ops.notes


def test_a_candidate_that_refuses_the_inputs_leaves_them_to_eager(tmp_path: Path) -> None:
    """The Gluon MLA kernel refuses these inputs (off its tile and on the CPU, with a ValueError
    naming why); the block still decodes, with eager attention, and the note says so."""
    ops, tuned, eager = _decode_with_one_table(
        tmp_path, MLA, "mla_decode", name="gluon_mla_decode.py", params={}
    )
    for t, e in zip(tuned, eager, strict=True):
        assert _rel(t, e) < 1e-6
    refusals = [n for n in ops.notes if "gluon_mla_decode.py refused the inputs" in n]
    assert refusals and "use triton_mla_decode.py" in refusals[0], ops.notes


def test_compiled_mla_block_keeps_its_fused_candidates_opaque(tmp_path, monkeypatch) -> None:
    """With the epilogue tables, DeepSeek's block under torch.compile calls its fused ops
    (mla_rope_norm's three outputs, mla_decode_value's five inputs) as opaque ops in one graph,
    as many as the eager tuned block calls candidates, and matches the eager block."""
    entries = _entries(MLA, "decode", epilogues=True)
    assert {"mla_rope_norm", "mla_decode_value"} <= set(entries)
    calls, targets = _compiled_against_eager(MLA, entries, tmp_path, monkeypatch)
    assert sum("tuned_kernel" in t for t in targets) == len(calls) >= len(entries)
    w_uv = (MLA.heads, MLA.v_head_dim, MLA.kv_lora_rank)
    assert any(tuple(a[0][-1].shape) == w_uv for a in calls), "mla_decode_value ran traced"
    assert any(tuple(a[0][2].shape) == (MLA.kv_lora_rank,) for a in calls), "mla_rope_norm traced"


def test_dims_without_an_entry_fall_back_to_eager(tmp_path: Path) -> None:
    entries = _entries(LLAMA, "decode")
    for row in entries["swiglu"]:
        row["dims"]["ffn"] = LLAMA.ffn + 1
    _write_tables(tmp_path, {"swiglu": entries["swiglu"]})
    ops = tuned_ops(tmp_path, "cpu")
    _run(LLAMA, ops, "decode")
    assert any("swiglu" in n and "no dispatch entry, eager" in n for n in ops.notes), ops.notes


@pytest.mark.parametrize(
    "task",
    [
        "skinny_gemm",
        "rmsnorm_linear",
        "linear_residual",
        "rmsnorm_linear_swiglu",
        "rmsnorm_linear_rope",
    ],
)
def test_skinny_gemms_are_not_used_above_their_tuned_rows(task: str, tmp_path: Path) -> None:
    fused = task != "skinny_gemm"
    epilogues = task.endswith(("swiglu", "rope"))
    entries = _entries(LLAMA, "decode", fused, epilogues)  # tuned at m = 2
    _write_tables(tmp_path, {task: entries[task]})
    ops = tuned_ops(tmp_path, "cpu")
    tuned = _run(LLAMA, ops, "prefill")  # m = 24
    eager = _run(LLAMA, eager_ops(), "prefill")
    assert all(torch.equal(t, e) for t, e in zip(tuned, eager, strict=True))
    assert any(f"({task})" in n and "outside the tuned range" in n for n in ops.notes), ops.notes


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_no_dispatch_tables_gives_eager_ops_with_a_note(where: str, tmp_path: Path) -> None:
    folder = tmp_path / "nothing" if where == "missing" else tmp_path
    ops = tuned_ops(folder, "cpu")
    assert any("tuned ops are the eager ops" in n for n in ops.notes)
    assert ops.rmsnorm is eager_ops().rmsnorm
    tuned = _run(LLAMA, ops, "prefill")
    eager = _run(LLAMA, eager_ops(), "prefill")
    assert torch.equal(tuned[0], eager[0])


def test_bytes_streamed_by_hand() -> None:
    cfg = LlamaConfig(hidden=8, heads=2, kv_heads=1, head_dim=4, ffn=6)
    # norms 2*8; qkv (2+2)*4 x 8 = 128; o 8 x 8 = 64; gate/up 12 x 8 = 96; down 8 x 6 = 48.
    weights = 16 + 128 + 64 + 96 + 48
    assert param_count(cfg) == weights
    assert sum(w.numel() for w in make_weights(cfg).values()) == weights
    kv = 2 * 3 * 1 * 5 * 4  # K and V, batch 3, 1 KV head, context 5, head_dim 4
    assert bytes_streamed(cfg, batch=3, context=5) == 2 * (weights + kv)
    mla = MlaConfig(
        hidden=8, heads=2, q_lora_rank=4, kv_lora_rank=6, qk_nope_dim=3, rope_dim=2,
        v_head_dim=5, ffn=6,
    )  # fmt: skip
    # norms 8+4+6+8; wq_a 4x8; wq_b 2*5 x 4; wkv_a 8x8; w_uk 2*3*6; w_uv 2*5*6; wo 8 x 10;
    # gate/up 12 x 8; down 8 x 6.
    mla_weights = 26 + 32 + 40 + 64 + 36 + 60 + 80 + 96 + 48
    assert param_count(mla) == mla_weights
    assert bytes_streamed(mla, batch=2, context=7, itemsize=4) == 4 * (
        mla_weights + 2 * 7 * (6 + 2)
    )


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="kv_heads"):
        LlamaConfig(heads=6, kv_heads=4)
    with pytest.raises(ValueError, match=r"MlaConfig\.heads"):
        MlaConfig(heads=0)
    with pytest.raises(ValueError, match="mode"):
        make_inputs(LLAMA, "train", 1, 4)
    with pytest.raises(ValueError, match="layers must be a positive integer, got 0"):
        make_inputs(LLAMA, "decode", 1, 4, layers=0)
    with pytest.raises(ValueError, match="weights lack"):
        decoder_block(LLAMA, {}, eager_ops())


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def test_tuned_source_comes_from_the_run_workspace_commit(tmp_path: Path) -> None:
    """A candidate the loop edited is run as committed in the run's workspace, not as shipped."""
    shipped = (load_task("rmsnorm").folder / "torch_rmsnorm.py").read_text()
    edited = shipped.replace(
        "return (xf * inv * weight.float())", "return (2 * xf * inv * weight.float())"
    )
    assert edited != shipped
    commit = _git_commit_file(tmp_path / "workspace" / "study", "rmsnorm/torch_rmsnorm.py", edited)
    rows = _entries(LLAMA, "decode", fused=False)["rmsnorm"]
    for row in rows:
        row["commit"] = commit
    _write_tables(tmp_path, {"rmsnorm": rows})
    ops = tuned_ops(tmp_path, "cpu")
    x = torch.randn(2, LLAMA.hidden)
    w = torch.ones(LLAMA.hidden)
    assert torch.allclose(ops.rmsnorm(x, w), 2 * eager_ops().rmsnorm(x, w), rtol=1e-5)
    assert any("workspace commit" in n for n in ops.notes), ops.notes


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("cfg", "mode"),
    [(c, m) for c in CONFIGS for m in ("decode", "prefill", "chunk")],
    ids=lambda v: getattr(v, "kind", v),
)
def test_block_replays_in_a_cuda_graph(cfg, mode: str) -> None:
    from baselines.timer import GpuTimer

    block = decoder_block(cfg, make_weights(cfg, "cuda"), eager_ops())
    tokens = {"tokens": 5} if mode == "chunk" else {}
    size = SIZES["prefill" if mode == "chunk" else mode]
    inputs = make_inputs(cfg, mode, *size, device="cuda", seed=2, **tokens)
    direct = getattr(block, mode)(*inputs)
    graph, out = GpuTimer("cuda").capture(lambda: getattr(block, mode)(*inputs))
    for t in out:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(out, direct, strict=True):
        # The same kernels, though cuBLAS may pick another algorithm under capture.
        assert torch.isfinite(got).all() and _rel(got, want) < 1e-2


def test_the_fused_ops_compose_the_unfused_ones() -> None:
    """Each fused op of the eager ops is its composition: the norm into the projection, with
    rope on the q/k rows (v's untouched) or SwiGLU after it, and the residual add."""
    ops, gen = eager_ops(), torch.Generator().manual_seed(1)
    x, r = torch.randn(3, 16, generator=gen), torch.randn(3, 12, generator=gen)
    g, w = torch.randn(16, generator=gen), torch.randn(20, 16, generator=gen)
    cos, sin = torch.randn(3, 2, generator=gen), torch.randn(3, 2, generator=gen)
    normed = ops.rmsnorm(x, g)
    qk, v = ops.rmsnorm_linear_rope(x, g, w[:12], w[12:], cos, sin)
    want_qk = ops.rope((normed @ w[:12].t()).reshape(3, 3, 4), cos, sin).reshape(3, 12)
    torch.testing.assert_close(qk, want_qk)
    torch.testing.assert_close(v, normed @ w[12:].t())
    torch.testing.assert_close(ops.rmsnorm_linear_swiglu(x, g, w), ops.swiglu(normed @ w.t()))
    torch.testing.assert_close(ops.linear_residual(x, w[:12], r), x @ w[:12].t() + r)
    q, k, v = (torch.randn(3, h, 5, 4, generator=gen) for h in (4, 2, 2))
    w_o = torch.randn(12, 16, generator=gen)
    attn = ops.attention_decode(q[:, :, 0], k, v).reshape(3, 16)
    torch.testing.assert_close(
        ops.gqa_decode_residual(q[:, :, 0], k, v, w_o, r), attn @ w_o.t() + r
    )


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.kind)
def test_a_stack_runs_its_blocks_in_sequence_each_on_its_own_caches(cfg) -> None:
    blocks = [decoder_block(cfg, make_weights(cfg, "cpu", seed=s), eager_ops()) for s in (1, 2)]
    stack = stacked_block(blocks)
    x, caches_a, caches_b, cos, sin = make_inputs(cfg, "decode", 2, 5, seed=3, layers=2)
    assert caches_a.shape[0] == caches_b.shape[0] == 2
    out = stack.decode(x, caches_a, caches_b, cos, sin)
    first = blocks[0].decode(x, caches_a[0], caches_b[0], cos, sin)
    second = blocks[1].decode(first[0], caches_a[1], caches_b[1], cos, sin)
    assert len(out) == 5
    for got, want in zip(out, (second[0], *first[1:], *second[1:]), strict=True):
        assert torch.equal(got, want)
    xp, cos_p, sin_p = make_inputs(cfg, "prefill", 1, 4, seed=3, layers=2)
    (once,) = blocks[0].prefill(xp, cos_p, sin_p)
    assert torch.equal(stack.prefill(xp, cos_p, sin_p)[0], blocks[1].prefill(once, cos_p, sin_p)[0])
    x, caches_a, caches_b, cos, sin = make_inputs(cfg, "chunk", 2, 6, seed=3, layers=2, tokens=3)
    out = stack.chunk(x, caches_a, caches_b, cos, sin)
    first = blocks[0].chunk(x, caches_a[0], caches_b[0], cos, sin)
    second = blocks[1].chunk(first[0], caches_a[1], caches_b[1], cos, sin)
    for got, want in zip(out, (second[0], *first[1:], *second[1:]), strict=True):
        assert torch.equal(got, want)


def test_compiling_a_tuned_block_consults_no_table_at_dims_it_never_runs(tmp_path: Path) -> None:
    """The fused kernels' fakes (the outputs' shapes while the compiler traces) are the plain
    eager ops: a composition of tuned ops would look their tables up at dims the block never
    runs them at, and leave notes saying so."""
    tables = _entries(LLAMA, "decode", fused=True, epilogues=True)
    tables["rmsnorm_linear"] = _entries(LLAMA, "decode")["rmsnorm_linear"]  # never needed
    _write_tables(tmp_path, tables)
    ops = tuned_ops(tmp_path, "cpu")
    block = decoder_block(LLAMA, make_weights(LLAMA, "cpu", seed=1), ops)
    inputs = make_inputs(LLAMA, "decode", *SIZES["decode"], seed=2)
    direct = block.decode(*inputs)
    notes = list(ops.notes)
    assert not any(n.startswith("rmsnorm_linear (") for n in notes), notes
    compiled = compiled_block(block, backend="eager").decode(*inputs)
    assert ops.notes == notes
    for got, want in zip(compiled, direct, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", ["prefill", "chunk"])
def test_mla_attention_gets_rows_sdpa_can_stream(mode) -> None:
    """The MLA block hands its expanded attention q, k and v whose last dim is contiguous: with
    any other stride SDPA's memory-efficient backend refuses them and its math backend
    materialises the scores (32 GiB at a 4k chunk of a 32k prompt)."""
    seen: list[tuple[int, ...]] = []
    eager = eager_ops()

    def recording(q, k, v):
        seen.append((q.stride(-1), k.stride(-1), v.stride(-1)))
        return eager.mla_attention_prefill(q, k, v)

    ops = dataclasses.replace(eager, mla_attention_prefill=recording)
    block = decoder_block(MLA, make_weights(MLA, "cpu", seed=0), ops)
    tokens = 5 if mode == "chunk" else None
    getattr(block, mode)(*make_inputs(MLA, mode, 2, 12, device="cpu", seed=1, tokens=tokens))
    assert seen == [(1, 1, 1)]

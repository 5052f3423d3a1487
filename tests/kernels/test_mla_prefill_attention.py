"""MLA's expanded prefill attention task (q and k wider than v): reference, inputs, shapes,
counts, and its shipped candidates (CPU; Triton under the interpreter)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from loop.tasks import load_task
from tests.kernels.candidate_tools import evaluate_on_cpu, mutated
from tests.kernels.task_checks import candidate_module, run_interpreted


@pytest.fixture(scope="module")
def task():
    return load_task("mla_prefill_attention")


def _dense(q, k, v) -> np.ndarray:
    q_len, kv_len = q.shape[2], k.shape[2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[3])
    rows = np.arange(q_len)[:, None] + kv_len - q_len
    s = np.where(np.arange(kv_len)[None, :] > rows, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


@pytest.mark.parametrize("budget", [1 << 27, 40])
def test_reference_is_bottom_right_causal_attention_with_a_narrower_v(
    task, monkeypatch, budget
) -> None:
    monkeypatch.setattr(task.module, "REFERENCE_BUDGET", budget)
    for shape in task.shapes("cpu"):
        q, k, v = (t.double() for t in task.make_inputs(shape, 3, "cpu"))
        assert q.shape[-1] == k.shape[-1] == 32 and v.shape[-1] == 16
        got = task.reference(q, k, v).numpy()
        assert got.shape[-1] == 16
        np.testing.assert_allclose(got, _dense(q.numpy(), k.numpy(), v.numpy()), rtol=1e-10)


def test_gpu_shapes_are_deepseeks_heads_at_a_prompt_and_two_chunks(task) -> None:
    shapes = task.shapes("cuda")
    assert [(s.dims["q_len"], s.dims["kv_len"]) for s in shapes] == [
        (4096, 4096),
        (4096, 32768),
        (8192, 65536),
    ]
    assert {(s.dims["heads"], s.dims["head_dim"], s.dims["v_head_dim"]) for s in shapes} == {
        (128, 192, 128)
    }


def test_flops_and_bytes_count_q_and_k_at_192_and_v_and_the_output_at_128(task) -> None:
    chunk = next(s for s in task.shapes("cuda") if s.name == "b1-q4096-kv32768")
    pairs = 4096 * (32768 - 4096) + 4096 * 4097 // 2
    assert task.flops(chunk) == 2 * 128 * (192 + 128) * pairs
    q_k, v = 2 * 128 * 192, 2 * 128 * 128
    assert task.bytes_read_written(chunk) == (q_k * (4096 + 32768) + v * 32768, v * 4096)


def test_peers_run_sdpa_with_a_narrower_v_and_cudnn_only_on_the_gpu(task) -> None:
    assert set(task.default_peers("cpu")) == {"eager"}
    assert {"eager", "sdpa-cudnn", "torch.compile"} <= set(task.default_peers("cuda"))
    shape = task.shapes("cpu")[-1]
    inputs = task.make_inputs(shape, 2, "cpu")
    want = task.reference(*(t.double() for t in inputs))
    torch.testing.assert_close(task.peers["eager"](*inputs).double(), want, rtol=1e-4, atol=1e-5)


def test_candidates_pass_and_a_dropped_rope_product_or_mask_is_rejected(task, tmp_path) -> None:
    """Both loads at three tile shapes; copies that skip the rope columns' product, that scale
    by v's width, or that drop the causal mask are caught."""
    src = task.folder / "triton_mla_prefill_attention.py"
    params = {"block_m": 16, "block_n": 16, "num_stages": 1}
    bugs = {
        "no-rope": (
            "qk = tl.dot(qr, tl.trans(kr), qk, ",
            "qk = qk + 0 * tl.dot(qr, tl.trans(kr), ",
        ),
        "v-scale": ("LOG2E / math.sqrt(d)", "LOG2E / math.sqrt(dv)"),
        "no-mask": (
            "visible = (rn[None, :] <= rm[:, None] + offset) & (rn[None, :] < kv_len)",
            "visible = rn[None, :] < kv_len",
        ),
    }
    specs = {
        f"{loads}-m{m}-n{n}": (src, {"block_m": m, "block_n": n, "num_stages": 1, "loads": loads})
        for loads in ("descriptor", "pointer")
        for m, n in ((16, 16), (32, 16), (16, 32))
    }
    good = [*specs, "torch"]
    specs["torch"] = (task.folder / "torch_mla_prefill_attention.py", {"chunk": 64})
    for name, (old, new) in bugs.items():
        specs[name] = (mutated(src, old, new, tmp_path / f"{name}.py"), params)
    ev = evaluate_on_cpu(task, specs)
    for label in good:
        verdict = ev.by_label(label)
        assert verdict.accepted, (label, verdict.reasons)
        assert max(s.rel_err for s in verdict.shapes.values()) < 2e-5
    for name in bugs:
        assert [r.code for r in ev.by_label(name).reasons] == ["mismatch"], name


def test_triton_candidate_refuses_a_head_dim_split_it_cannot_tile(task) -> None:
    module = candidate_module(task, "triton_mla_prefill_attention.py")
    q = torch.zeros(1, 2, 16, 32)
    for v_dim in (24, 8, 48, 32):  # not a power of two; under 16; wider than q; no rest
        v = torch.zeros(1, 2, 16, v_dim)
        with pytest.raises(ValueError, match=rf"narrower v's \({v_dim}\)"):
            module.kernel(q, q, v, loads="pointer")
    with pytest.raises(ValueError, match=r"rest of q's \(8\) each be a power of two"):
        module.kernel(torch.zeros(1, 2, 16, 24), torch.zeros(1, 2, 16, 24), q[..., :16])
    with pytest.raises(ValueError, match=r"head_dim \(32, 16\) must match"):
        module.kernel(q, q[..., :16], q[..., :16])


def test_triton_candidate_takes_head_transposed_views_as_a_decoder_block_passes_them(task) -> None:
    """It declares STRIDED_INPUTS, so a block hands it q and v as (b, t, h, d) projections seen
    as (b, h, t, d): under the interpreter, both loads read them in place and match the task's
    reference."""
    assert candidate_module(task, "triton_mla_prefill_attention.py").STRIDED_INPUTS is True
    script = """
import json, torch
from tests.kernels.task_checks import candidate_module
from loop.tasks import load_task
task = load_task("mla_prefill_attention")
module = candidate_module(task, "triton_mla_prefill_attention.py")
gen = torch.Generator().manual_seed(7)
b, h, t, length, dv, dr = 1, 2, 16, 48, 16, 16
q = torch.randn(b, t, h, dv + dr, generator=gen).transpose(1, 2)
k = torch.randn(b, h, length, dv + dr, generator=gen)
v = torch.randn(b, length, h, dv, generator=gen).transpose(1, 2)
want = task.module.reference(q, k, v).double()
errors = {}
for loads in ("descriptor", "pointer"):
    out = module.kernel(q, k, v, block_m=16, block_n=16, num_stages=1, loads=loads)
    errors[loads] = (out.double() - want).abs().max().item()
print(json.dumps({"strided": not (q.is_contiguous() or v.is_contiguous()), "errors": errors}))
"""
    done = json.loads(run_interpreted(script))
    assert done["strided"]
    assert set(done["errors"]) == {"descriptor", "pointer"}
    assert max(done["errors"].values()) < 1e-4, done["errors"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "params",
    [
        {"block_n": 64, "num_stages": 2},
        {"block_n": 64, "num_stages": 2, "loads": "pointer"},
        {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3},
    ],
)
def test_triton_candidate_matches_the_reference_on_gpu(task, params) -> None:
    """A whole 4k prompt and a 4k chunk of a 32k prompt, at DeepSeek's heads."""
    from loop.evaluator import CandidateSpec, evaluate

    spec = CandidateSpec(task.folder / "triton_mla_prefill_attention.py", params)
    ev = evaluate(task, [spec], "cuda", shapes=["b1-q4096-kv4096", "b1-q4096-kv32768"])
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons

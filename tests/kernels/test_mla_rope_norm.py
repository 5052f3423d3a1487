"""The MLA rope-and-norm task: reference, inputs, shapes, and its shipped candidates (CPU;
Triton under the interpreter, its sm_90 PTX compiled here, and on the GPU)."""

from __future__ import annotations

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.task_checks import (
    assert_interpreted_and_mutant_caught,
    assert_shipped_accepted,
    assert_wrong_rejected,
    candidate_module,
    evaluate_with_wrong,
    gpu_evaluate,
    hopper_ptx,
)

# The latent's norm without its weight g: right only where g is all ones.
WRONG = """
import torch

LANGUAGE = "torch"
PARAMS = {}


def kernel(q, kv, g, cos, sin):
    r = 2 * cos.shape[1]
    c = kv.shape[1] - r
    cs, sn = cos[:, None, :], sin[:, None, :]

    def rope(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cs - x2 * sn, x2 * cs + x1 * sn), dim=-1).to(q.dtype)

    latent = kv[:, :c].float()
    ckv = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + 1e-6)
    return rope(q[..., -r:]), ckv.to(q.dtype), rope(kv[:, None, c:])[:, 0]
"""


@pytest.fixture(scope="module")
def task():
    return load_task("mla_rope_norm")


def test_reference_rotates_the_rope_parts_and_normalises_the_latent(task) -> None:
    # one token, one head: nope part (9), rope part (1, 2); latent (3, -4), rope key (5, 6)
    q = torch.tensor([[[9.0, 1.0, 2.0]]], dtype=torch.float64)
    kv = torch.tensor([[3.0, -4.0, 5.0, 6.0]], dtype=torch.float64)  # latent mean square 12.5
    g = torch.tensor([2.0, 0.5], dtype=torch.float64)
    cos = torch.tensor([[0.0]], dtype=torch.float64)  # a quarter turn
    sin = torch.tensor([[1.0]], dtype=torch.float64)
    q_pe, ckv, kpe = task.reference(q, kv, g, cos, sin)
    scale = (12.5 + task.module.EPS) ** -0.5
    torch.testing.assert_close(q_pe, torch.tensor([[[-2.0, 1.0]]], dtype=torch.float64))
    torch.testing.assert_close(ckv, torch.tensor([[6.0 * scale, -2.0 * scale]]).double())
    torch.testing.assert_close(kpe, torch.tensor([[-6.0, 5.0]], dtype=torch.float64))


def test_inputs_and_the_eager_peer(task) -> None:
    shape = task.shapes("cpu")[-1]
    q, kv, g, cos, sin = task.module.make_inputs(shape.to_dict(), 3, "cpu")
    d = shape.dims
    assert q.shape == (d["tokens"], d["heads"], d["nope_dim"] + d["rope_dim"])
    assert kv.shape == (d["tokens"], d["kv_lora_rank"] + d["rope_dim"])
    assert cos.shape == sin.shape == (d["tokens"], d["rope_dim"] // 2)
    torch.testing.assert_close(cos.double() ** 2 + sin.double() ** 2, torch.ones_like(cos).double())
    assert float(kv[:, : d["kv_lora_rank"]].pow(2).mean()) > 2.0  # the norm has a scale to undo
    want = task.reference(q, kv, g, cos, sin)
    assert all(0.3 < float(t.std()) < 3.0 for t in want)
    for got, ref in zip(task.peers["eager"](q, kv, g, cos, sin), want, strict=True):
        assert got.shape == ref.shape
        assert float((got.double() - ref).norm() / ref.norm()) < 1e-5


def test_gpu_shapes_are_deepseeks_attention_inputs(task) -> None:
    shapes = {s.name: s for s in task.shapes("cuda")}
    one = shapes["decode-1x128-d128-r64-c512"]
    assert {s.dims["tokens"] for s in shapes.values()} == {1, 16, 64, 4096}
    # q's 128 rope parts and kv read, three outputs written, g, cos and sin (float32)
    assert task.bytes_moved(one) == 2 * (2 * (128 * 64 + 512 + 64) + 512) + 4 * 64


def test_candidates_on_cpu_and_a_wrong_kernel(task, tmp_path) -> None:
    ev = evaluate_with_wrong(
        task,
        [("torch_mla_rope_norm.py", {}), ("torch_mla_rope_norm.py", {"compute": "input"})],
        WRONG,
        tmp_path,
    )
    assert_shipped_accepted(ev)
    assert_wrong_rejected(ev)


def test_the_triton_candidate_refuses_mismatched_inputs_naming_them(task) -> None:
    kernel = candidate_module(task, "triton_mla_rope_norm.py").kernel
    q, kv, g, cos, sin = task.module.make_inputs(task.shapes("cpu")[1].to_dict(), 1, "cpu")
    with pytest.raises(ValueError, match="a row for each of q's 5 tokens"):
        kernel(q, kv, g, cos[:2], sin[:2])
    with pytest.raises(ValueError, match="a row for each of q's 5 tokens"):
        kernel(q, kv[:2], g, cos, sin)
    with pytest.raises(ValueError, match=r"g \(23,\)"):
        kernel(q, kv, g[:-1], cos, sin)
    with pytest.raises(ValueError, match="need q"):
        kernel(q[0], kv, g, cos, sin)


@pytest.mark.parametrize(
    "bug",
    [
        (  # pairs a query element with its neighbour instead of the one half a rope part away
            "q2 = tl.load(src + half, mask=ok, other=0.0)",
            "q2 = tl.load(src + 1, mask=ok, other=0.0)",
        ),
        (  # the mean over the padded width, not the latent's
            "tl.sum(x * x, axis=0) / c + eps",
            "tl.sum(x * x, axis=0) / C_PAD + eps",
        ),
        (  # steps kv's rows by the row's width: right on a contiguous kv only
            "row = kv_ptr + tok * stride_kvt",
            "row = kv_ptr + tok * (c + 2 * half)",
        ),
        (  # steps q's heads by their width: right on a contiguous q only
            "heads[:, None].to(tl.int64) * stride_qh",
            "heads[:, None].to(tl.int64) * (nope + 2 * half)",
        ),
    ],
    ids=["rope-pairs", "norm-width", "kv-stride", "q-stride"],
)
@pytest.mark.parametrize("params", [{"head_block": 2}, {"head_block": 32, "num_warps": 2}])
def test_the_triton_candidate_under_the_interpreter_and_a_mutant(
    task, tmp_path, bug, params
) -> None:
    # 3 and 2 heads over blocks of 2 (a ragged last block) or one block; latents of 24 and 40
    # padded to 32 and 64; the evaluator's views (padded rows) catch the stride mutants
    assert_interpreted_and_mutant_caught(task, "triton_mla_rope_norm.py", params, bug, tmp_path)


def test_the_triton_kernel_waits_before_reading_and_lets_the_next_launch_after(task) -> None:
    """Compiled for sm_90 (no GPU needed): nothing is read or written before
    griddepcontrol.wait, and the trigger that lets the next kernel launch comes right after it,
    before any load."""
    module = candidate_module(task, "triton_mla_rope_norm.py")
    types = dict.fromkeys(("q_ptr", "kv_ptr", "g_ptr", "qpe_ptr", "ckv_ptr", "kpe_ptr"), "*bf16")
    types |= dict.fromkeys(("cos_ptr", "sin_ptr"), "*fp32") | {"eps": "fp32"}
    types |= dict.fromkeys(
        ("n_heads", "nope", "c", "half", "stride_qt", "stride_qh", "stride_kvt", "stride_c"), "i32"
    )
    types["stride_s"] = "i32"
    constexprs = {"HB": 32, "HALF": 32, "C_PAD": 512, "PDL": True}
    ptx = hopper_ptx(module._rope_norm, types, constexprs, 1)
    before, wait, after = ptx.partition("griddepcontrol.wait")
    assert wait and "ld.global" not in before and "st.global" not in before
    assert after.count("griddepcontrol.launch_dependents") == 1
    trigger = after.index("griddepcontrol.launch_dependents")
    assert trigger < after.index("ld.global") < after.index("st.global")


def _cat(outs) -> torch.Tensor:
    return torch.cat([o.double().reshape(-1) for o in outs])


@pytest.mark.gpu
def test_gpu_candidates_match_the_reference(task) -> None:
    ev = gpu_evaluate(
        task,
        [
            ("triton_mla_rope_norm.py", {}),
            ("triton_mla_rope_norm.py", {"head_block": 4, "num_warps": 4}),
            ("torch_mla_rope_norm.py", {}),
        ],
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, (verdict.label, verdict.reasons)


@pytest.mark.gpu
def test_the_triton_candidate_waits_for_the_kernels_that_write_its_inputs(task) -> None:
    """Launched with programmatic dependent launch right after a kernel that writes one of its
    inputs 2 ms late, it still reads the new values, for each input in turn."""
    from tests.kernels.pdl_checks import assert_waits_for_late_inputs

    module = candidate_module(task, "triton_mla_rope_norm.py")
    shape = next(s for s in task.shapes("cuda") if s.name == "decode-16x128-d128-r64-c512")
    inputs = task.make_inputs(shape, 7, "cuda")
    want = _cat(task.reference(*(t.double() for t in inputs)))
    assert_waits_for_late_inputs(lambda *a: _cat(module.kernel(*a)), inputs, want)

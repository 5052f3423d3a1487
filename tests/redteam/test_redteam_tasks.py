"""Red-team suite, the task definitions (the thirteenth red team, 2026-12-07): tricks that the
generic checks cannot see, because only a task's own FORBIDDEN_OPS, inputs and tolerance decide
them. Each candidate goes through the public evaluator on the CPU beside the task's honest torch
candidate, and must be rejected with the reason code that names the trick; the honest one must
pass the same batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task

HERE = Path(__file__).parent / "candidates_tasks"

# task -> {entry: (candidate, expected code)}
TRICKS = {
    "linear_residual": {
        "12-gemm-as-conv1d": ("linres_via_conv1d.py", "calls-reference"),
        "12-gemm-as-bilinear": ("linres_via_bilinear.py", "calls-reference"),
    },
    "head_gemv": {"12-gemv-as-grouped-conv1d": ("headgemv_via_conv1d.py", "calls-reference")},
    "skinny_gemm": {
        "12-gemm-as-grouped-mm": ("skinny_via_grouped_mm.py", "calls-reference"),
        "12-gemm-as-lazy-conv1d": ("skinny_via_lazyconv1d.py", "calls-reference"),
        "12-gemm-as-numpy-dot": ("skinny_via_numpy_dot.py", "calls-reference"),
        "12-gemm-as-vmapped-dot": ("skinny_via_vmap_dot.py", "calls-reference"),
    },
    "rmsnorm": {"12-norm-as-renorm": ("rmsnorm_via_renorm.py", "calls-reference")},
    "fp8_gemm": {"12-gemm-as-addbmm": ("fp8_via_addbmm.py", "calls-reference")},
    "add_rmsnorm": {
        "12-norm-as-native-layer-norm": (
            "add_rmsnorm_via_native_layer_norm.py",
            "calls-reference",
        )
    },
    "softmax": {
        "12-softmax-as-categorical": ("softmax_via_categorical.py", "calls-reference"),
        "12-softmax-as-softmax2d": ("softmax_via_softmax2d.py", "calls-reference"),
        "12-logsumexp-as-logcumsumexp": ("softmax_via_logcumsumexp.py", "calls-reference"),
        "10-no-max-subtracted": ("softmax_without_max.py", "non-finite-output"),
        "11-tail-zeroed": ("softmax_drops_tail.py", "mismatch"),
    },
    "cross_entropy": {
        "12-loss-as-crossentropyloss": ("ce_via_crossentropyloss.py", "calls-reference"),
        "12-loss-as-categorical": ("ce_via_categorical.py", "calls-reference"),
        "12-logsumexp-as-logcumsumexp": ("ce_via_logcumsumexp.py", "calls-reference"),
        "10-no-max-subtracted": ("ce_without_max.py", "non-finite-output"),
    },
    "prefill_attention": {
        "12-attention-as-varlen-attn": ("prefill_via_varlen_attn.py", "calls-reference"),
        # refuses the odd ragged twins and is right at multiples of 8: caught at another even
        # length, of the three twins a shape verifies (RAGGED_CHECKED)
        "13-refuses-odd-wrong-off-8": ("prefill_refuses_odd_lengths.py", "mismatch"),
    },
    "rmsnorm_linear": {"10-no-eps": ("rmsnorm_linear_without_eps.py", "non-finite-output")},
    "rmsnorm_linear_rope": {
        "10-no-eps": ("rmsnorm_linear_rope_without_eps.py", "non-finite-output")
    },
    "rmsnorm_linear_swiglu": {
        "10-no-eps": ("rmsnorm_linear_swiglu_without_eps.py", "non-finite-output")
    },
    "mla_rope_norm": {"10-no-eps": ("mla_rope_norm_without_eps.py", "non-finite-output")},
    # verified at a ragged twin of each shape (RAGGED_TAIL): the table serves every length from
    # one bucket to the next, and no shape's cache length was off a multiple of 256 from 256 on
    "gqa_decode": {
        "13-wrong-off-measured-lengths": ("gqa_wrong_off_measured_lengths.py", "mismatch"),
        "13-refuses-odd-wrong-at-even": ("gqa_refuses_odd_lengths.py", "mismatch"),
    },
}
HONEST = "honest"


def _evaluate(task_name: str, tricks: dict):
    task = load_task(task_name)
    specs = [CandidateSpec(HERE / name, {}, entry) for entry, (name, _) in tricks.items()]
    honest = CandidateSpec(task.folder / f"torch_{task_name}.py", {}, HONEST)
    return evaluate(task, [*specs, honest], "cpu")


@pytest.mark.parametrize("task_name", TRICKS)
def test_the_task_rejects_each_trick(task_name: str) -> None:
    ev = _evaluate(task_name, TRICKS[task_name])
    for entry, (_, code) in TRICKS[task_name].items():
        verdict = ev.by_label(entry)
        assert not verdict.accepted, entry
        assert code in {r.code for r in verdict.reasons}, (entry, verdict.reasons)
    assert ev.by_label(HONEST).accepted, ev.by_label(HONEST).reasons


def test_a_kernel_may_refuse_ragged_lengths_it_cannot_run() -> None:
    """Refusing a ragged twin with a ValueError is no rejection: the blocks run the eager op."""
    task = load_task("gqa_decode")
    spec = CandidateSpec(HERE / "gqa_refuses_ragged_lengths.py", {}, "refuser")
    verdict = evaluate(task, [spec], "cpu").by_label("refuser")
    assert verdict.accepted, verdict.reasons

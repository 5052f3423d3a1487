"""The evaluator on the CPU: honest candidates pass, each kind of wrong one is rejected with its
reason code, and a crash or hang costs only the candidate that caused it."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.evaluator import CandidateSpec, Limits, evaluate
from loop.tasks import load_task

HERE = Path(__file__).parent / "candidates"
SHAPES = ["decode-7x256", "long-512x1100"]


@pytest.fixture(scope="module")
def task():
    return load_task("rmsnorm")


def codes(verdict) -> set[str]:
    return {r.code for r in verdict.reasons}


def test_honest_candidates_are_accepted_on_every_cpu_shape(task) -> None:
    specs = [
        CandidateSpec(task.folder / "torch_rmsnorm.py", {"chunk_rows": 64}, "torch"),
        CandidateSpec(task.folder / "triton_rmsnorm.py", {"rows_per_program": 2}, "triton"),
    ]
    ev = evaluate(task, specs, "cpu")
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons
        assert set(verdict.shapes) == {s.name for s in task.shapes("cpu")}
        assert all(s.rel_err < task.tolerance("float32") for s in verdict.shapes.values())


def test_wrong_candidates_get_their_reason_codes(task) -> None:
    expected = {
        "returns_zeros.py": "constant-output",
        "wrong_math.py": "mismatch",
        "scales_inputs.py": "inputs-modified",
        "raises.py": "crash",
        "import_fails.py": "import-error",
        "wrong_dtype.py": "wrong-output-layout",
        "transposed.py": "wrong-output-layout",
        "subclass_output.py": "wrong-output-type",
        "syntax_error.py": "syntax-error",
    }
    specs = [CandidateSpec(HERE / name, {}, name) for name in expected]
    ev = evaluate(task, specs, "cpu", shapes=SHAPES)
    for name, code in expected.items():
        verdict = ev.by_label(name)
        assert not verdict.accepted
        assert code in codes(verdict), (name, verdict.reasons)


def test_repeated_labels_are_refused_before_any_run(task) -> None:
    """The worker reports by label, so two specs (or a spec and a peer) under one label would
    share one verdict: the second configuration's result would stand for both."""
    spec = CandidateSpec(task.folder / "torch_rmsnorm.py", {}, "same")
    other = CandidateSpec(HERE / "wrong_math.py", {}, "same")
    with pytest.raises(ValueError, match=r"repeated: \['same'\]"):
        evaluate(task, [spec, other], "cpu", shapes=SHAPES)
    named_as_peer = CandidateSpec(task.folder / "torch_rmsnorm.py", {}, "eager")
    with pytest.raises(ValueError, match=r"repeated: \['eager'\]"):
        evaluate(task, [named_as_peer], "cpu", shapes=SHAPES, peers=["eager"])


def test_a_size_one_dimension_may_have_any_stride(task) -> None:
    """A one-row output is laid out the same whatever its row stride (torch.compile's MLA
    decode returned (512, 512, 1) for a (1, 128, 512) output, and was rejected for it)."""
    one_row = "decode-1x256"
    spec = CandidateSpec(HERE / "size_one_strides.py", {}, "size-one")
    ev = evaluate(task, [spec], "cpu", shapes=[one_row, "decode-7x256"])
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons
    assert set(ev.verdicts[0].shapes) == {one_row, "decode-7x256"}


def test_a_hang_is_a_timeout_for_that_candidate_only(task) -> None:
    ev = evaluate(
        task,
        [CandidateSpec(HERE / "hangs.py", {}, "hangs")],
        "cpu",
        shapes=SHAPES,
        limits=Limits(timeout_s=6),
    )
    assert codes(ev.by_label("hangs")) == {"timeout"}
    after = evaluate(task, [CandidateSpec(task.folder / "torch_rmsnorm.py")], "cpu", shapes=SHAPES)
    assert after.verdicts[0].accepted


def test_unknown_params_and_missing_files_never_reach_a_worker(task, tmp_path) -> None:
    specs = [
        CandidateSpec(task.folder / "torch_rmsnorm.py", {"nope": 1}, "bad-name"),
        CandidateSpec(task.folder / "torch_rmsnorm.py", {"chunk_rows": 3}, "bad-value"),
        CandidateSpec(tmp_path / "absent.py", {}, "absent"),
    ]
    ev = evaluate(task, specs, "cpu")
    assert codes(ev.by_label("bad-name")) == {"bad-params"}
    assert codes(ev.by_label("bad-value")) == {"bad-params"}
    assert codes(ev.by_label("absent")) == {"missing-file"}


def test_timing_on_cpu_gives_blocks_for_candidate_and_peer(task) -> None:
    ev = evaluate(
        task,
        [CandidateSpec(task.folder / "torch_rmsnorm.py")],
        "cpu",
        time_it=True,
        peers=["eager"],
        shapes=["decode-7x256"],
        rule={"min_blocks": 4, "max_blocks": 4, "samples_per_block": 5},
    )
    for verdict in ev.verdicts:
        assert verdict.accepted, verdict.reasons
        shape = verdict.shapes["decode-7x256"]
        assert len(shape.blocks_s) == 4 and all(t > 0 for t in shape.blocks_s)
        assert shape.method == "host-clock"

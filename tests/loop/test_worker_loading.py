"""How the worker loads a candidate: as its own module, compiled from the tree the guard checked,
with the candidate's own language semantics (not the harness's `from __future__` flags) and
registered under its module name while it runs, as an ordinary import would be."""

from __future__ import annotations

import textwrap
from pathlib import Path

from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task

# A frozen dataclass config, as the CuPy candidates use: dataclasses resolves string annotations
# through sys.modules[cls.__module__], so a module compiled with inherited future flags and
# missing from sys.modules fails to import (seen on the H200 for both shipped CuPy kernels).
DATACLASS_CANDIDATE = textwrap.dedent(
    '''
    """RMSNorm in torch ops with its settings in a frozen dataclass."""

    import dataclasses
    from dataclasses import dataclass

    import torch

    LANGUAGE = "torch"
    PARAMS = {}


    @dataclass(frozen=True)
    class Settings:
        eps: float = 1e-6
        upcast: bool = True


    SETTINGS = Settings()
    ANNOTATION_TYPES = tuple(f.type for f in dataclasses.fields(SETTINGS))


    def kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if ANNOTATION_TYPES != (float, bool):
            raise TypeError(f"annotations were not evaluated: {ANNOTATION_TYPES}")
        hidden = x.float() if SETTINGS.upcast else x
        scale = torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + SETTINGS.eps)
        return (hidden * scale * weight.float()).to(x.dtype)
    '''
)


def test_a_candidate_with_a_dataclass_loads_with_its_own_semantics(tmp_path: Path) -> None:
    path = tmp_path / "dataclass_rmsnorm.py"
    path.write_text(DATACLASS_CANDIDATE)
    ev = evaluate(load_task("rmsnorm"), [CandidateSpec(path, {}, "dataclass")], "cpu")
    (verdict,) = ev.verdicts
    assert verdict.accepted, verdict.reasons


def test_the_worker_runs_the_text_that_was_checked_not_the_file_now(tmp_path: Path) -> None:
    """A file swapped after the static checks (while the worker starts) is not what runs: the
    request carries the checked text."""
    import secrets
    import time

    from loop.worker import supervise

    honest = (load_task("rmsnorm").folder / "torch_rmsnorm.py").read_text()
    path = tmp_path / "swapped.py"
    path.write_text('import os\nLANGUAGE = "torch"\ndef kernel(x, weight):\n    return x\n')
    request = {
        "task": "rmsnorm",
        "device": "cpu",
        "secret": secrets.randbits(62),
        "candidates": [{"label": "swapped", "path": str(path), "source": honest, "params": {}}],
        "peers": [],
        "shapes": ["decode-7x256"],
        "time": False,
        "timeout_s": 120,
    }
    (runner,) = supervise(request, time.monotonic())["runners"]
    assert runner["verdict"] == "accepted", runner["reasons"]


def test_evaluate_sends_the_checked_text(tmp_path: Path, monkeypatch) -> None:
    import loop.evaluator as evaluator

    sent = []
    monkeypatch.setattr(
        evaluator,
        "_run_worker",
        lambda request, *_: (sent.append(request), ({"runners": []}, None))[1],
    )
    path = tmp_path / "dataclass_rmsnorm.py"
    path.write_text(DATACLASS_CANDIDATE)
    evaluate(load_task("rmsnorm"), [CandidateSpec(path, {}, "dataclass")], "cpu")
    (request,) = sent
    assert request["candidates"][0]["source"] == DATACLASS_CANDIDATE


def test_triton_on_the_cpu_runs_only_shipped_or_trusted_code(tmp_path: Path, monkeypatch) -> None:
    """Under Triton's interpreter a kernel's stores reach any host address, so on the CPU only
    the task's own files run, unless the user says the code is trusted."""
    from loop.evaluator import TRUST_INTERPRETER_ENV

    task = load_task("rmsnorm")
    shipped = task.folder / "triton_rmsnorm.py"
    copy = tmp_path / "triton_rmsnorm_copy.py"
    copy.write_text(shipped.read_text() + "\n# edited\n")
    monkeypatch.delenv(TRUST_INTERPRETER_ENV, raising=False)
    ev = evaluate(
        task, [CandidateSpec(shipped, {}, "shipped"), CandidateSpec(copy, {}, "edited")], "cpu"
    )
    assert ev.by_label("shipped").accepted, ev.by_label("shipped").reasons
    assert [r.code for r in ev.by_label("edited").reasons] == ["unsupported-device"]
    monkeypatch.setenv(TRUST_INTERPRETER_ENV, "1")
    trusted = evaluate(task, [CandidateSpec(copy, {}, "edited")], "cpu")
    assert trusted.by_label("edited").accepted, trusted.by_label("edited").reasons

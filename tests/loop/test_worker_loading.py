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

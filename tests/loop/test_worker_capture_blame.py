"""A runner's CUDA-graph capture runs its Python (a torch.compile peer compiles there, and the
libraries it loads may change process state). What a capture changes is charged to that runner
when the capture ends, not to whichever runner's block happens to be checked first."""

from __future__ import annotations

import textwrap

import pytest

from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task

# A trusted peer that leaves an "error" warning filter behind each time its Python runs, which
# on the GPU is only while it is captured.
TASK = textwrap.dedent(
    """
    import warnings

    import torch

    SHAPES = {"cuda": [{"name": f"n{n}", "n": n, "dtype": "float32"} for n in (256, 512, 1024, 2048)]}
    TOLERANCE = {"float32": 1e-5}


    def make_inputs(shape, seed, device):
        gen = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(shape["n"], 64, generator=gen, device=device) + 3.0,)


    def reference(x):
        return x * 2.0


    def bytes_moved(shape):
        return 8 * 64 * shape["n"]


    def flops(shape):
        return 64 * shape["n"]


    def state_changing(x):
        warnings.simplefilter("error", ResourceWarning)
        return x * 2.0


    PEERS = {"state-changing": state_changing}
    """
)

CANDIDATE = textwrap.dedent(
    """
    import torch

    LANGUAGE = "torch"


    def kernel(x):
        return x * 2.0
    """
)


@pytest.mark.gpu
def test_a_peers_capture_is_not_charged_to_the_candidate(tmp_path) -> None:
    folder = tmp_path / "capture_blame"
    folder.mkdir()
    (folder / "task.py").write_text(TASK)
    (folder / "double.py").write_text(CANDIDATE)
    task = load_task(str(folder))
    rule = {"samples_per_block": 3, "min_blocks": 4, "max_blocks": 6, "warmup": 1}
    ev = evaluate(
        task,
        [CandidateSpec(folder / "double.py", {}, "double")],
        "cuda",
        time_it=True,
        peers=["state-changing"],
        rule=rule,
    )
    (verdict,) = [v for v in ev.verdicts if v.kind == "candidate"]
    assert verdict.accepted, verdict.reasons
    assert set(verdict.shapes) == {"n256", "n512", "n1024", "n2048"}

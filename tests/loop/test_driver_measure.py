"""One keep-or-revert measurement (`loop.driver._measure`): an incumbent that fails only beside
the challenger costs the challenger, not the loop; an incumbent that fails alone too stops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.driver import LoopConfig, LoopError, _measure
from loop.proposers import Proposal
from loop.tasks import load_task

RULE = {"samples_per_block": 3, "min_blocks": 2, "max_blocks": 4, "max_time_s": 0.5, "warmup": 1}
HONEST = """
import torch
LANGUAGE = "torch"
def kernel(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
"""
# Right, except that it fails once another runner has written its input buffer between two of
# its calls: it passes alone and fails when timed beside anything.
FAILS_BESIDE_OTHERS = HONEST.replace(
    "def kernel(x, weight):\n",
    '_last = {"x": None, "v": 0}\n'
    "def kernel(x, weight):\n"
    '    if _last["x"] is x and x._version >= _last["v"] + 2:\n'
    '        raise RuntimeError("another runner wrote my buffer")\n'
    '    _last["x"] = x\n'
    '    _last["v"] = x._version + 0\n',
)
FAILS_WHEN_TIMED = HONEST.replace(
    "def kernel(x, weight):\n",
    "_calls = [0]\n"
    "def kernel(x, weight):\n"
    "    _calls[0] += 1\n"
    "    if _calls[0] > 6:\n"
    '        raise RuntimeError("worn out")\n',
)


def measure(tmp_path: Path, incumbent_source: str):
    incumbent = tmp_path / "incumbent.py"
    incumbent.write_text(incumbent_source)
    challenger = tmp_path / "challenger.py"
    challenger.write_text(HONEST)
    cfg = LoopConfig(
        task=load_task("rmsnorm"),
        candidate=incumbent,
        device="cpu",
        trials=1,
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
        out_dir=tmp_path,
        rule=RULE,
        shapes=["decode-7x256"],
    )
    return _measure(cfg, incumbent, {}, Proposal(challenger, {}, "honest"), 0.005)


def test_an_incumbent_failing_only_beside_the_challenger_discards_the_challenger(tmp_path) -> None:
    outcome = measure(tmp_path, FAILS_BESIDE_OTHERS)
    assert outcome.status == "crash"
    assert outcome.reasons == ["crash"]
    assert "failed beside this challenger (and passed alone)" in outcome.messages[0]


def test_an_incumbent_failing_on_its_own_stops_the_loop(tmp_path) -> None:
    with pytest.raises(LoopError, match="the incumbent failed verification"):
        measure(tmp_path, FAILS_WHEN_TIMED)

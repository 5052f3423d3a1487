"""scripts/sweep_best.py: the fastest accepted configuration at a shape of a sweep's JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


def _verdict(params: dict, verdict: str, **blocks: list[float]) -> dict:
    shapes = {name: {"name": name, "blocks_s": times} for name, times in blocks.items()}
    return {"kind": "candidate", "params": params, "verdict": verdict, "shapes": shapes}


SWEEP = {
    "task": "mla_decode",
    "sweep": True,
    "verdicts": [
        _verdict({"a": 1}, "accepted", s4k=[3.0, 3.0, 9.0], s32k=[5.0, 5.0, 5.0]),
        _verdict({"a": 2}, "accepted", s4k=[4.0, 4.0, 1.0], s32k=[6.0, 6.0, 6.0]),
        _verdict({"a": 3}, "rejected", s4k=[0.5, 0.5, 0.5], s32k=[0.5, 0.5, 0.5]),
        {
            "kind": "peer",
            "params": {},
            "verdict": "accepted",
            "shapes": {"s4k": {"blocks_s": [0.1]}},
        },
    ],
}


def test_the_least_median_accepted_candidate_wins_at_each_shape(tmp_path, capsys) -> None:
    script = import_file(ROOT / "scripts" / "sweep_best.py")
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(SWEEP))
    # at s4k, {"a": 2} has the least mean but not the least median; rejected and peers never win
    assert script.main([str(path), "s4k"]) == 0
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    SWEEP["verdicts"][1]["shapes"]["s32k"]["blocks_s"] = [4.0, 4.0, 4.0]
    path.write_text(json.dumps(SWEEP))
    assert script.main([str(path), "s32k"]) == 0
    assert json.loads(capsys.readouterr().out) == {"a": 2}


def test_a_shape_nobody_was_timed_at_or_a_broken_file_is_an_error(tmp_path, capsys) -> None:
    script = import_file(ROOT / "scripts" / "sweep_best.py")
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(SWEEP))
    assert script.main([str(path), "s1m"]) == 1
    assert "no accepted candidate was timed at 's1m'" in capsys.readouterr().err
    path.write_text("{trunc")
    assert script.main([str(path), "s4k"]) == 1
    assert "sweep.json" in capsys.readouterr().err
    assert script.main([str(path)]) == 2


def test_a_config_of_another_candidate_file_never_wins(tmp_path, capsys) -> None:
    """A sweep config written FILE{...} (labelled FILE:cfgN) is another candidate's: its
    parameters would not fit the sweep's own file, so it is left out even where fastest."""
    script = import_file(ROOT / "scripts" / "sweep_best.py")
    other = _verdict({"merge": "fold"}, "accepted", s4k=[0.2, 0.2, 0.2])
    other["label"] = "triton_gqa_decode.py:cfg3"
    own = _verdict({"a": 4}, "accepted", s4k=[2.0, 2.0, 2.0])
    own["label"] = "cfg4"
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({**SWEEP, "verdicts": [*SWEEP["verdicts"], other, own]}))
    assert script.main([str(path), "s4k"]) == 0
    assert json.loads(capsys.readouterr().out) == {"a": 4}

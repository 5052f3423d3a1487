"""Dispatch tables: per-shape winners, loaded as a function model code calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.dispatch import Choice, build_dispatch, load, save_dispatch


def test_load_picks_by_shape(tmp_path: Path) -> None:
    rows = [
        {
            "shape": "decode",
            "dims": {"tokens": 1, "hidden": 4096},
            "source": "candidate",
            "name": "triton_rmsnorm.py",
            "params": {"BLOCK": 1024},
            "commit": "abc",
            "speedup": None,
        },
        {
            "shape": "long",
            "dims": {"tokens": 32768, "hidden": 4096},
            "source": "peer",
            "name": "torch.compile",
            "params": {},
            "speedup": None,
        },
    ]
    path = tmp_path / "d.json"
    save_dispatch(build_dispatch("rmsnorm", "tokens", rows), path)
    pick = load(path)
    assert pick(tokens=16, hidden=4096) == Choice(
        "candidate", "triton_rmsnorm.py", {"BLOCK": 1024}, "decode", "abc"
    )
    assert pick(tokens=100_000, hidden=4096).name == "torch.compile"
    with pytest.raises(LookupError):
        pick(tokens=16, hidden=7168)
    save_dispatch(build_dispatch("rmsnorm", "tokens", []), path)
    with pytest.raises(LookupError, match="no entries"):
        load(path)

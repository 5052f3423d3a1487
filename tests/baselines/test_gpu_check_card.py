"""scripts/gpu-check.sh runs no stage on a card other than GPU_CHECK_CARD names, and its stages
where the card matches; the card's name comes from a stand-in nvidia-smi on PATH (no GPU here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"
CARD = "NVIDIA H100 80GB HBM3"


def _run(tmp_path: Path, card_wanted: str | None) -> subprocess.CompletedProcess:
    """gpu-check.sh with one stage no case of the script handles (it only prints its header), a
    stand-in nvidia-smi that names an H100, and nothing else of the GPU machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{CARD}'\n")
    smi.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "WHL_DIR": str(tmp_path / "no-wheels"),
        "GPU_CHECK_BUDGET": "120",
        "TMPDIR": str(tmp_path),  # the script's work folder (mktemp -d), never removed
    }
    env.pop("GPU_CHECK_CARD", None)
    if card_wanted is not None:
        env["GPU_CHECK_CARD"] = card_wanted
    return subprocess.run(
        ["bash", str(SCRIPT), "nostage"], env=env, capture_output=True, text=True, timeout=120
    )


def test_another_card_runs_no_stage(tmp_path: Path) -> None:
    done = _run(tmp_path, "H200")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "the card is not an H200 (GPU_CHECK_CARD): no stage run" in done.stdout
    assert "== stage" not in done.stdout
    assert (tmp_path / "out" / "results.tgz").is_file()  # what was read is still packed


@pytest.mark.parametrize("wanted", ["H100", "h100", None])
def test_the_card_asked_for_runs_the_stages(tmp_path: Path, wanted: str | None) -> None:
    done = _run(tmp_path, wanted)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== stage nostage" in done.stdout
    assert "no stage run" not in done.stdout

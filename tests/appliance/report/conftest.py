"""One real CPU run of the pipeline, shared by the report tests that need a real report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of `autotune run --device cpu --quick --trials 1 --task rmsnorm`."""
    out = tmp_path_factory.mktemp("cpu-run")
    cmd = [sys.executable, "-m", "appliance", "run", "--out", str(out), "--device", "cpu"]
    cmd += ["--quick", "--trials", "1", "--task", "rmsnorm", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout)["valid"]
    return out


@pytest.fixture(scope="session")
def here_fingerprint() -> dict:
    """This host's fingerprint, taken once (it takes seconds)."""
    from appliance.fingerprint import collect_fingerprint

    return collect_fingerprint()

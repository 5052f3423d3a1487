"""The Gluon kernels' sm_90 build tests, run again with the lent GPU's Triton (3.6.0), which
`.ci/run` installs into .ci/device-triton: Gluon's names and rules change between Triton
releases, and a kernel that builds only with the project's Triton costs a device call to find
out (session 35's second call)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE_TRITON = ROOT / ".ci" / "device-triton"
VERSION = "3.6.0"
# Every test that builds a Gluon kernel for sm_90 on the CPU, and the descriptors' test.
BUILD_TESTS = [
    "tests/kernels/test_gqa_decode.py",
    "tests/kernels/test_linear_residual.py",
    "tests/kernels/test_rmsnorm_linear_rope.py",
    "tests/kernels/test_rmsnorm_linear_swiglu.py",
    "tests/kernels/test_mla_decode_value.py",
    "tests/kernels/test_mla_sm90_resources_script.py",
    "tests/kernels/test_prefill_sm90_schedule_script.py",
    "tests/kernels/test_gluon_descriptors.py",
]


def test_the_gluon_kernels_build_with_the_devices_triton() -> None:
    if not (DEVICE_TRITON / f"triton-{VERSION}.dist-info").is_dir():
        pytest.skip(
            f"no Triton {VERSION} in {DEVICE_TRITON} (`uv pip install --python .venv/bin/python "
            f"--target .ci/device-triton --no-deps triton=={VERSION}`, as .ci/run does)"
        )
    env = {**os.environ, "PYTHONPATH": str(DEVICE_TRITON)}
    probe = [sys.executable, "-c", "import triton; print(triton.__version__)"]
    assert subprocess.run(probe, env=env, capture_output=True, text=True).stdout.strip() == VERSION
    tests = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *BUILD_TESTS]
    tests += ["-k", "gluon or sm90 or descriptor"]
    run = subprocess.run(tests, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]

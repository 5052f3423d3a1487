"""scripts/probe_wgmma_gpu.py: its CPU side (the layout emulation behind --selfcheck, the CUDA
source's build, the no-GPU exit); the GPU runs are recorded under docs/benchmarks/ (session 52)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.kernels.task_checks import nvcc_with_sm90a
from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


NVCC = nvcc_with_sm90a()


def _script():
    return import_file(ROOT / "scripts" / "probe_wgmma_gpu.py")


def test_the_descriptors_read_back_every_operand_element_where_the_fill_put_it() -> None:
    script = _script()
    assert set(script.emulate().values()) == {0}
    assert set(script.emulate()) == {
        "qk_kmajor_n64",
        "pv_ss_n64",
        "pv_ss_n256",
        "tile32_chain_ss_tt",
    }
    assert script.fragment_maps_ok() and script.accumulator_is_a_fragment()


@pytest.mark.parametrize("name", list(_script().NEGATIVE_CONTROLS))
def test_the_emulation_catches_a_wrong_layout(name) -> None:
    script = _script()
    change, test = script.NEGATIVE_CONTROLS[name]
    assert script.emulate(**change)[test] > 0


@pytest.mark.skipif(NVCC is None, reason="no nvcc that builds for sm_90a on this machine")
def test_the_source_builds_for_sm90a(tmp_path) -> None:
    cu = tmp_path / "probe.cu"
    cu.write_text(_script().cuda_source())
    built = subprocess.run(
        [NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-c", str(cu), "-o", str(tmp_path / "probe.o")],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr


def test_without_a_gpu_it_says_so_and_exits_2(capsys) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    assert _script().main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out

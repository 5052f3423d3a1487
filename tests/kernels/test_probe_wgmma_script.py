"""scripts/probe_wgmma_gpu.py: its CPU side (the layout emulation behind --selfcheck, the
generated wgmma wrappers, the no-GPU exit); the GPU run itself is recorded under
docs/benchmarks/ (session 52)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or next(
    (p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None
)


def _script():
    return import_file(ROOT / "scripts" / "probe_wgmma_gpu.py")


def test_the_descriptors_read_back_every_operand_element_where_the_fill_put_it() -> None:
    script = _script()
    assert script.emulate() == {"qk_kmajor_n64": 0, "pv_ss_n64": 0, "pv_ss_n256": 0}
    assert script.fragment_maps_ok() and script.accumulator_is_a_fragment()


@pytest.mark.parametrize(
    "change, test",
    [
        ({"mn_lbo": 1024, "mn_sbo": 8192}, "pv_ss_n256"),  # V's LBO and SBO swapped
        ({"swizzle": lambda addr: addr}, "qk_kmajor_n64"),  # read without the swizzle
        ({"base": 3 * 1024 + 128}, "qk_kmajor_n64"),  # a region off its 1024-byte boundary
    ],
)
def test_the_emulation_catches_a_wrong_layout(change, test) -> None:
    assert _script().emulate(**change)[test] > 0


def test_the_source_has_one_wgmma_wrapper_per_shape_and_operand_form() -> None:
    source = _script().cuda_source()
    assert "@WGMMA@" not in source
    for shape in ("m64n64k16", "m64n256k16"):
        assert f"wgmma.mma_async.sync.aligned.{shape}.f32.bf16.bf16" in source
    # ss (K-major B), ss_t at n64 and n256, rs_t at n64 and n256
    assert source.count("__device__ __forceinline__ void wgmma_") == 5


@pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")
def test_the_source_builds_for_sm90a(tmp_path) -> None:
    cu = tmp_path / "probe.cu"
    cu.write_text(_script().cuda_source())
    subprocess.run(
        [NVCC, "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-c", str(cu), "-o", str(tmp_path / "probe.o")],
        check=True,
        capture_output=True,
    )  # fmt: skip


def test_without_a_gpu_it_says_so_and_exits_2(capsys) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    assert _script().main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out

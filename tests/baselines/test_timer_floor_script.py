"""scripts/bench_timer_floor.py: its rows' arithmetic, its CUDA source, and its refusal without
a GPU (the measurement itself runs on the GPU only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.kernels.task_checks import assert_cuda_compiles
from tests.source_files import import_file

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_timer_floor.py"


@pytest.fixture(scope="module")
def floor():
    return import_file(SCRIPT)


def test_a_read_row_gives_bytes_per_second_and_percent_of_copy(floor):
    samples = [10e-6, 11e-6, 12e-6, 10e-6, 11e-6]  # median 11 us
    row = floor.floor_row("read 4.4 MB", 4_400_000, samples, copy_bps=4e11)
    assert row.us == pytest.approx(11.0)
    assert row.us_lo <= row.us <= row.us_hi
    assert row.bytes_per_s == pytest.approx(4e11)
    assert row.pct_of_copy == pytest.approx(100.0)


def test_the_empty_kernel_row_has_no_bandwidth(floor):
    row = floor.floor_row("empty kernel", 0, [4e-6, 5e-6, 6e-6], copy_bps=4e12)
    assert row.us == pytest.approx(5.0)
    assert row.bytes_per_s is None and row.pct_of_copy is None


def test_the_kernels_compile_for_hopper(floor):
    assert_cuda_compiles(
        floor.SOURCE,
        [f"-DVPT={floor.READ_VECTORS_PER_THREAD}", "--gpu-architecture=sm_90"],
        "bench_timer_floor",
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(floor, capsys):
    assert floor.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err

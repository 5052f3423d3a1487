"""scripts/bench_l2_prefetch.py: its prefetch kernel, built for sm_90 without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kernels.task_checks import hopper_ptx
from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


def test_the_prefetch_asks_l2_for_a_range_per_lane_and_reads_nothing() -> None:
    """One bulk L2 prefetch per lane and no load of the weight into the program: the GEMV
    timed after it reads the weight itself."""
    pytest.importorskip("triton")
    script = import_file(ROOT / "scripts" / "bench_l2_prefetch.py")
    types = {"ptr": "*u8", "n_bytes": "i64"}
    ptx = hopper_ptx(script._prefetch_l2, types, {"LANE_BYTES": script.LANE_BYTES}, 1)
    body = [line.strip() for line in ptx.splitlines()]
    assert sum(line.startswith("cp.async.bulk.prefetch.L2.global") for line in body) == 1
    assert not any(re.match(r"ld\.global", line) for line in body)


def test_the_script_refuses_to_run_without_a_gpu(capsys) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    script = import_file(ROOT / "scripts" / "bench_l2_prefetch.py")
    assert script.main([]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("evict_first", [False, True])
def test_the_cache_read_takes_an_evict_first_policy_only_when_asked(evict_first) -> None:
    """The stand-in for the attention's cache read: with evict_first its loads carry an L2
    evict-first policy (so lines prefetched before it can stay), without it none."""
    pytest.importorskip("triton")
    script = import_file(ROOT / "scripts" / "bench_l2_prefetch.py")
    types = {"x_ptr": "*bf16", "out_ptr": "*fp32", "n": "i32"}
    constexprs = {"BLOCK": script.READ_BLOCK, "EVICT_FIRST": evict_first}
    ptx = hopper_ptx(script._read, types, constexprs, 4)
    assert ("L2::evict_first" in ptx) is evict_first
    assert "ld.global" in ptx

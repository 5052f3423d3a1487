"""scripts/mla_sm90_resources.py: the MLA split kernel's sm_90 build costs, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


def test_a_build_reports_registers_spills_shared_memory_and_its_products() -> None:
    pytest.importorskip("triton")
    script = import_file(ROOT / "scripts" / "mla_sm90_resources.py")
    kernel = import_file(ROOT / "kernels" / "mla_decode" / "triton_mla_decode.py")._split_kernel
    row = script.resources(kernel, 32, 32, 8, 2, True)
    assert row["tokens_as_rows"] is True and (row["block_h"], row["num_warps"]) == (32, 8)
    assert 0 < row["registers"] <= 255
    assert row["spill_bytes"] >= 0 and row["shared_bytes"] > 0
    assert row["mma"] in ("wgmma", "mma.sync")

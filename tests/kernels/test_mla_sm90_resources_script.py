"""scripts/mla_sm90_resources.py: the MLA split kernel's sm_90 build costs, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernels.task_checks import assert_partitions_wait_before_memory, setmaxnreg_budgets
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


@pytest.mark.parametrize(
    "block_n, stages, eager", [(32, 2, False), (32, 4, False), (32, 4, True), (64, 2, True)]
)
def test_the_gluon_kernel_builds_as_two_warpgroups_and_a_loader(block_n, stages, eager) -> None:
    """The Gluon split kernel fits an SM's shared memory; its warps are split
    into partitions with their own register budgets (setmaxnreg), and ptxas keeps each chunk's
    products chained: 13 groups a tile (nine score chunks, four output chunks) at each of the
    four places that issue them, not one an instruction (at 64-key tiles without eager_values
    Triton 3.9's build serialises them all; 3.6's, the H200's, does not)."""
    pytest.importorskip("triton")
    script = import_file(ROOT / "scripts" / "mla_sm90_resources.py")
    module = import_file(script.GLUON)
    compiled = script.gluon_build(block_n, stages, eager)
    row = script.gluon_resources(block_n, stages, eager)
    assert 0 < row["shared_bytes"] <= module.SHARED_BYTES
    budgets = setmaxnreg_budgets(compiled.asm["ptx"])
    assert {24, 240} <= budgets
    assert row["groups"] == 4 * 13 < row["wgmma"], "ptxas serialised the products"
    assert row["ex2"] > 0


@pytest.mark.parametrize("block_n, stages", [(64, 2), (32, 4)])
def test_the_shared_probabilities_build_fences_them_before_the_other_warpgroup_reads(
    block_n, stages
) -> None:
    """With shared_p a warpgroup writes a tile's probabilities to shared memory for the other
    warpgroup's products: the build fits, keeps its two budgets and chained products, and
    before each one-thread arrival that publishes them every thread of the partition has
    fenced its writes for the async proxy (fence.proxy.async, then the partition's
    128-thread barrier)."""
    pytest.importorskip("triton")
    script = import_file(ROOT / "scripts" / "mla_sm90_resources.py")
    module = import_file(script.GLUON)
    compiled = script.gluon_build(block_n, stages, False, True)
    row = script.gluon_resources(block_n, stages, False, True)
    assert 0 < row["shared_bytes"] <= module.SHARED_BYTES
    ptx = compiled.asm["ptx"]
    assert {24, 240} <= setmaxnreg_budgets(ptx)
    assert 0 < row["groups"] < row["wgmma"], "ptxas serialised the products"
    lines = [line.strip() for line in ptx.splitlines()]
    fences = [i for i, line in enumerate(lines) if line.startswith("fence.proxy.async")]
    published = [
        next(j for j in range(i, len(lines)) if "mbarrier.arrive" in lines[j]) for i in fences
    ]
    assert fences and all(
        any(lines[k].startswith("bar.sync") and lines[k].endswith("128;") for k in range(i, j))
        for i, j in zip(fences, published, strict=True)
    )


@pytest.mark.parametrize("shared_p", [False, True])
def test_the_gluon_split_kernel_waits_for_the_kernel_before_it_in_every_partition(
    shared_p,
) -> None:
    """Programmatic dependent launch done safely in each of the three partitions (the default
    one, a warpgroup; the other warpgroup; the loader warp): griddepcontrol.wait before any
    global load, store or TMA copy; the one launch_dependents is the loader's, after its wait
    and before its first TMA copy (task_checks.assert_partitions_wait_before_memory)."""
    pytest.importorskip("triton")
    script = import_file(ROOT / "scripts" / "mla_sm90_resources.py")
    ttgir = script.gluon_build(32, 4, False, shared_p).asm["ttgir"]
    assert_partitions_wait_before_memory(ttgir, 3)

"""scripts/prefill_sm90_schedule.py: the prefill kernels' sm_90 builds and whether their softmax
overlaps their products, in Triton's PTX and in ptxas's machine code, without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kernels.task_checks import setmaxnreg_budgets
from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    return import_file(ROOT / "scripts" / "prefill_sm90_schedule.py")


def test_only_exponentials_while_a_group_is_in_flight_count(script) -> None:
    ptx = "\n".join(
        [
            "ex2.approx.f32 %f1, %f2;",  # nothing in flight yet
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 ...;",
            "wgmma.commit_group.sync.aligned;",
            "\tex2.approx.f32 %f3, %f4;",  # overlaps the group above
            "wgmma.commit_group.sync.aligned;",
            "wgmma.wait_group.sync.aligned 1;",  # one group still in flight
            "ex2.approx.f32 %f5, %f6;",
            "wgmma.wait_group.sync.aligned 0;",
            "ex2.approx.f32 %f7, %f8;",  # after the last wait
        ]
    )
    assert script.ex2_in_flight(ptx) == (2, 4)


def test_the_machine_code_count_follows_ptxas_waits(script) -> None:
    sass = "\n".join(
        [
            "        /*0010*/                   MUFU.EX2 R1, R2 ;   /* 0x0 */",
            "        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;",
            "        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;",
            "        /*0040*/                   MUFU.EX2 R3, R4 ;",  # overlaps that group
            "        /*0050*/                   HGMMA.64x128x16.F32.BF16 R88, R8, gdesc[UR12], R88, gsb0 ;",
            "        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;",
            "        /*0070*/                   MUFU.EX2 R5, R6 ;",  # one group still in flight
            "        /*0080*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
            "        /*0090*/                   MUFU.EX2 R7, R8 ;",
        ]
    )
    assert script.ex2_in_flight_sass(sass) == (2, 4)


def test_a_build_reports_its_resources_and_its_exponentials(script) -> None:
    pytest.importorskip("triton")
    row = script.schedule({"block_n": 64, "num_stages": 2, "max_registers": 128})
    assert row["params"]["loads"] == "descriptor" and row["params"]["block_m"] == 128
    assert 0 < row["registers"] <= 128
    assert row["spill_bytes"] >= 0 and row["shared_bytes"] > 0
    assert 0 <= row["ex2_in_flight"] <= row["ex2"] and row["ex2"] > 0
    assert 0 <= row["ex2_in_flight_sass"] <= row["ex2"]


@pytest.mark.parametrize(
    "config",
    [{}, {"num_stages": 3}, {"block_n": 64, "num_stages": 4}, {"block_n": 64, "pairs": True}],
)
def test_the_gluon_kernel_builds_as_two_warpgroups_and_a_loader(script, config) -> None:
    """Every shipped configuration that fits an SM's shared memory builds with no spill; its
    warps are split into partitions with their own register budgets (setmaxnreg), and each
    warpgroup waits for its scores with the previous tile's P V still in flight."""
    pytest.importorskip("triton")
    module = import_file(ROOT / "kernels" / "prefill_attention" / "gluon_prefill_attention.py")
    p = script._params(script.CANDIDATES["gluon"], module, config)
    compiled = script.gluon_build(p)
    resources = script.sm90_resources(compiled)
    assert resources["spill_bytes"] == 0
    assert 0 < resources["shared_bytes"] <= module.SHARED_BYTES
    ptx = compiled.asm["ptx"]
    budgets = setmaxnreg_budgets(ptx)
    assert {24, 240} <= budgets  # the loader warp's registers, and each warpgroup's
    assert "wgmma.wait_group.sync.aligned 1;" in ptx
    steps, groups = script.hgmma_groups(script.sm90_sass(compiled))
    assert steps >= 4 * groups > 0, "ptxas serialised the products"


def test_serialised_wgmma_shows_as_one_group_an_instruction(script) -> None:
    chained = "HGMMA.64x64x16 R24, gdesc[UR4], RZ ;\nHGMMA.64x64x16 R24, gdesc[UR8], R24, gsb0 ;"
    serial = chained.replace("RZ ;", "RZ, gsb0 ;")
    assert script.hgmma_groups(chained) == (2, 1)
    assert script.hgmma_groups(serial) == (2, 2)


def test_an_unknown_parameter_is_refused_by_name(script) -> None:
    pytest.importorskip("triton")
    with pytest.raises(ValueError, match="block_h"):
        script.schedule({"block_h": 16})


def test_gluon_pairs_keep_a_product_in_flight_over_half_the_softmaxes(script) -> None:
    """ptxas waits for a warpgroup's last product before its softmax whatever the PTX says;
    two tiles an iteration issue the second's Q K^T with the first's, and that one stays in
    flight over the first softmax (about a third of all exponentials, the masked tiles and the
    second of each pair not)."""
    pytest.importorskip("triton")
    pairs = script.schedule({"candidate": "gluon", "block_n": 64, "pairs": True})
    plain = script.schedule({"candidate": "gluon", "block_n": 64})
    assert pairs["ex2_in_flight_sass"] >= pairs["ex2"] // 6
    assert plain["ex2_in_flight_sass"] * 4 < pairs["ex2_in_flight_sass"]


def test_mla_heads_build_with_a_second_product_for_the_rope_dims(script) -> None:
    """The mla_prefill_attention candidate at q and k 128 + 64 wide, v 128: the scores take one
    more product a tile (the 64 rope columns) than Llama's, with no spill and within an SM's
    shared memory at a prefill_mla sweep tile; --mla with the Gluon candidate is refused."""
    pytest.importorskip("triton")
    config = {"block_n": 64, "num_stages": 3}
    llama, mla = script.schedule(config), script.schedule(config, mla=True)
    assert mla["spill_bytes"] == 0 and llama["shared_bytes"] < mla["shared_bytes"] <= 232448
    assert mla["hgmma"] > llama["hgmma"]
    with pytest.raises(ValueError, match="Triton candidate only"):
        script.schedule({"candidate": "gluon"}, mla=True)


def test_mla_defaults_build_within_shared_memory(script, monkeypatch, tmp_path) -> None:
    """--mla with no --config builds its own list (not Llama's, whose parameters the MLA
    candidate lacks); its first row, the candidate's keyword defaults that `autotune run` starts
    from, fits an SM's shared memory with no spill."""
    pytest.importorskip("triton")
    assert script.MLA_DEFAULT_CONFIGS[0] == {}
    monkeypatch.setattr(script, "MLA_DEFAULT_CONFIGS", script.MLA_DEFAULT_CONFIGS[:1])
    out = tmp_path / "rows.json"
    assert script.main(["--mla", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["spill_bytes"] == 0 and row["shared_bytes"] <= 232448

"""GPU topology: `nvidia-smi topo -m` parsing (hand-written example outputs in topo_fixtures/,
not recorded on real machines), pair facts, and the ACS-on-the-path check per GPU pair."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from host_tuning.fact import known, to_plain
from host_tuning.facts import GpuFacts, gather_facts
from host_tuning.lspci import pcie_capabilities
from host_tuning.topology import (
    gather_topology,
    pair_checks,
    parse_topo_matrix,
    pcie_path,
    topology_from,
)

FIXTURES = Path(__file__).parent / "topo_fixtures"


def matrix(name: str):
    return parse_topo_matrix((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    ("name", "gpus", "link01", "nics"),
    [
        ("pcie-2gpu-phb.txt", 2, "PHB", {}),
        ("pcie-4gpu-switch.txt", 4, "PIX", {"NIC0": "mlx5_0"}),
        ("pcie-8gpu.txt", 8, "PIX", {}),
        ("nvlink-8gpu-hgx.txt", 8, "NV18", {}),
        ("nvlink-2gpu-bridge.txt", 2, "NV4", {}),
        ("nvlink-4gpu-pairs.txt", 4, "NV12", {}),
    ],
)
def test_parses_every_example(name: str, gpus: int, link01: str, nics: dict) -> None:
    m = matrix(name)
    assert len(m.gpus) == gpus
    assert m.link("GPU0", "GPU1") == link01 == m.link("GPU1", "GPU0")
    assert m.link("GPU0", "GPU0") == "X"
    assert m.nics == nics
    assert set(m.affinity["GPU0"]) == {"CPU Affinity", "NUMA Affinity", "GPU NUMA ID"}


def test_switch_box_pairs_and_affinity() -> None:
    m = matrix("pcie-4gpu-switch.txt")
    assert m.devices == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0"]
    assert m.link("GPU0", "GPU2") == "SYS" and m.link("GPU2", "GPU3") == "PIX"
    assert m.link("GPU0", "NIC0") == "PXB"
    assert m.affinity["GPU2"]["NUMA Affinity"] == "1"


def test_spaces_instead_of_tabs_parse_the_same() -> None:
    text = (FIXTURES / "pcie-4gpu-switch.txt").read_text().replace("\t", "    ")
    assert parse_topo_matrix(text).links == matrix("pcie-4gpu-switch.txt").links


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: "no matrix here\n", "no header row"),
        (lambda t: t.replace("PIX", "FOO", 1), "unknown link code 'FOO'"),
        (lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith("GPU3")), "GPU3"),
        (lambda t: t.replace("GPU1\tPIX", "GPU1\tPXB", 1), "GPU0-GPU1 is PIX but GPU1-GPU0"),
    ],
)
def test_bad_matrix_names_the_problem(edit, message: str) -> None:
    text = edit((FIXTURES / "pcie-4gpu-switch.txt").read_text())
    with pytest.raises(ValueError, match=message):
        parse_topo_matrix(text)


def test_pair_facts_from_the_matrix() -> None:
    m = known(to_plain(matrix("pcie-4gpu-switch.txt")), "nvidia-smi topo -m")
    topo = topology_from(m, 4)
    assert len(topo.pairs) == 6
    near, far = topo.pair(0, 1), topo.pair(2, 0)
    assert (near.link.value, near.pcie_switch.value, near.host_bridge.value) == ("PIX", True, False)
    assert (far.link.value, far.pcie_switch.value, far.host_bridge.value) == ("SYS", False, True)
    assert near.nvlinks.value == 0 and not near.p2p.known
    nv = topology_from(known(to_plain(matrix("nvlink-8gpu-hgx.txt")), "x"), 8)
    assert len(nv.pairs) == 28 and {p.nvlinks.value for p in nv.pairs} == {18}
    assert not nv.pair(3, 5).pcie_switch.known  # NVLinked: the PCIe path needs NVML


def test_gather_on_a_fake_root_is_unknown_with_reasons(tmp_path: Path) -> None:
    topo = gather_topology(tmp_path)
    assert not topo.matrix.known and "facts root" in topo.matrix.reason
    assert topo.pairs == []
    assert topo.to_dict()["matrix"]["unknown"]


def test_pcie_path_keeps_only_bridges_below_the_meeting_point() -> None:
    path = pcie_path(["r", "sw_up", "sw_a"], ["r", "sw_up", "sw_b"], "a", "b")
    assert path.shared == ["r", "sw_up"] and path.bridges == ["sw_a", "sw_b"]
    assert pcie_path(["r1"], ["r2"], "a", "b").bridges == ["r1", "r2"]


# --- the pair ACS check on a fake sysfs tree and lspci text ----------------------------------

ROOT_PORT, SWITCH_UP = "0000:00:01.0", "0000:01:00.0"
DOWN = {"0000:03:00.0": "0000:02:08.0", "0000:04:00.0": "0000:02:10.0"}


def _bridge(address: str, redirect: bool) -> str:
    flag = "+" if redirect else "-"
    return (
        f"{address} PCI bridge: Example switch port\n"
        "\tCapabilities: [148 v1] Access Control Services\n"
        "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl-\n"
        f"\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir{flag} CmpltRedir{flag} UpstreamFwd+ "
        "EgressCtrl-\n"
    )


def _host(tmp_path: Path, redirect_on: set[str]):
    devices = tmp_path / "sys/bus/pci/devices"
    devices.mkdir(parents=True)
    for gpu, port in DOWN.items():
        target = f"../../../devices/pci0000:00/{ROOT_PORT}/{SWITCH_UP}/{port}/{gpu}"
        os.symlink(target, devices / gpu)
    bridges = [ROOT_PORT, SWITCH_UP, *DOWN.values()]
    text = "\n".join(_bridge(b, b in redirect_on) for b in bridges)
    text += "".join(f"\n{g} 3D controller: NVIDIA Corporation GH100\n" for g in DOWN)
    caps = pcie_capabilities(known(text, "lspci -D -vvv"), tmp_path, list(DOWN))
    gpus = [GpuFacts(i, "H100/H200", addr, {}) for i, addr in enumerate(DOWN)]
    base = gather_facts(root=tmp_path)
    return dataclasses.replace(base, gpus=gpus, pcie_capabilities=caps)


def test_redirect_on_a_switch_port_between_gpus_warns(tmp_path: Path) -> None:
    (result,) = pair_checks(_host(tmp_path, {"0000:02:10.0"}))
    assert (result.id, result.subject, result.status) == ("gpu.pair_acs", "gpu0-gpu1", "warn")
    assert "0000:02:10.0" in result.actual and "ReqRedir" in result.actual
    assert result.fix and result.needs == "bios"


def test_redirect_above_the_meeting_point_does_not_count(tmp_path: Path) -> None:
    (result,) = pair_checks(_host(tmp_path, {ROOT_PORT}))
    assert result.status == "pass" and not result.fix


def test_nvlinked_pair_passes_and_unreadable_lspci_is_unknown(tmp_path: Path) -> None:
    facts = _host(tmp_path, {"0000:02:08.0"})
    nv = topology_from(known(to_plain(matrix("nvlink-2gpu-bridge.txt")), "x"), 2)
    (result,) = pair_checks(facts, nv)
    assert result.status == "pass" and "NVLink" in result.actual
    no_lspci = dataclasses.replace(facts, pcie_capabilities=[])
    (unknown,) = pair_checks(no_lspci)
    assert unknown.status == "unknown" and unknown.message


def test_one_gpu_has_no_pair(tmp_path: Path) -> None:
    facts = _host(tmp_path, set())
    assert pair_checks(dataclasses.replace(facts, gpus=facts.gpus[:1])) == []

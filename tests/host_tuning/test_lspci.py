"""PCIe capabilities from lspci -vvv text, dmidecode BIOS facts, and the checks on them.

The sample texts below are written in the format lspci (pciutils 3.x) and
dmidecode 3.x print; they are not recordings of a particular host.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from host_tuning.checks import CheckResult, run_checks
from host_tuning.fact import known
from host_tuning.facts import HostFacts, gather_facts, parse_dmidecode_bios
from host_tuning.lspci import (
    SOURCE,
    parse_lspci,
    pcie_capabilities,
    read_lspci,
    size_bytes,
    upstream_bridges,
)
from host_tuning.nvml import SimulatedNvml, load_fixture
from tests.host_tuning.fake_host import lay_out

# Two H100 PCIe behind a PCIe switch (root port 40:01.1, switch 41:00.0 / 42:0x.0), as root.
SWITCHED = """\
0000:40:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge (prog-if 00 [Normal decode])
	Control: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+
	Bus: primary=40, secondary=41, subordinate=44, sec-latency=0
	Capabilities: [58] Express (v2) Root Port (Slot+), MSI 00
		DevCap:	MaxPayload 512 bytes, PhantFunc 0
			ExtTag+ RBE+
		DevCtl:	CorrErr+ NonFatalErr+ FatalErr+ UnsupReq+
			RlxdOrd- ExtTag+ PhantFunc- AuxPwr- NoSnoop+
			MaxPayload 256 bytes, MaxReadReq 512 bytes
		LnkSta:	Speed 32GT/s, Width x16
	Capabilities: [2a0 v1] Access Control Services
		ACSCap:	SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
		ACSCtl:	SrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
	Kernel driver in use: pcieport

0000:41:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
	Capabilities: [68] Express (v2) Upstream Port, MSI 00
		DevCap:	MaxPayload 2048 bytes, PhantFunc 0
		DevCtl:	CorrErr- NonFatalErr- FatalErr- UnsupReq-
			RlxdOrd+ ExtTag+ PhantFunc- AuxPwr- NoSnoop+
			MaxPayload 256 bytes, MaxReadReq 512 bytes
	Kernel driver in use: pcieport

0000:42:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
	Capabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00
		DevCap:	MaxPayload 2048 bytes, PhantFunc 0
		DevCtl:	CorrErr- NonFatalErr- FatalErr- UnsupReq-
			RlxdOrd+ ExtTag+ PhantFunc- AuxPwr- NoSnoop+
			MaxPayload 256 bytes, MaxReadReq 512 bytes
	Capabilities: [f24 v1] Access Control Services
		ACSCap:	SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
		ACSCtl:	SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
	Kernel driver in use: pcieport

0000:42:01.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
	Capabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00
		DevCap:	MaxPayload 2048 bytes, PhantFunc 0
		DevCtl:	CorrErr- NonFatalErr- FatalErr- UnsupReq-
			RlxdOrd+ ExtTag+ PhantFunc- AuxPwr- NoSnoop+
			MaxPayload 256 bytes, MaxReadReq 512 bytes
	Capabilities: [f24 v1] Access Control Services
		ACSCap:	SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
		ACSCtl:	SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
	Kernel driver in use: pcieport

0000:43:00.0 3D controller: NVIDIA Corporation GH100 [H100 PCIe] (rev a1)
	Subsystem: NVIDIA Corporation Device 1839
	Control: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+
	NUMA node: 0
	IOMMU group: 40
	Region 0: Memory at a8000000 (32-bit, non-prefetchable) [size=16M]
	Region 1: Memory at 28000000000 (64-bit, prefetchable) [size=128G]
	Region 3: Memory at 2a000000000 (64-bit, prefetchable) [size=32M]
	Capabilities: [60] Power Management version 3
		Flags: PMEClk- DSI- D1- D2- AuxCurrent=0mA PME(D0-,D1-,D2-,D3hot-,D3cold-)
		Status: D0 NoSoftRst+ PME-Enable- DSel=0 DScale=0 PME-
	Capabilities: [78] Express (v2) Endpoint, MSI 00
		DevCap:	MaxPayload 256 bytes, PhantFunc 0, Latency L0s unlimited, L1 <64us
			ExtTag+ AttnBtn- AttnInd- PwrInd- RBE+ FLReset+ SlotPowerLimit 0W
		DevCtl:	CorrErr- NonFatalErr- FatalErr- UnsupReq-
			RlxdOrd+ ExtTag+ PhantFunc- AuxPwr- NoSnoop+ FLReset-
			MaxPayload 256 bytes, MaxReadReq 512 bytes
		DevSta:	CorrErr- NonFatalErr- FatalErr- UnsupReq- AuxPwr- TransPend-
		LnkCap:	Port #0, Speed 32GT/s, Width x16, ASPM not supported
		LnkSta:	Speed 32GT/s, Width x16
	Capabilities: [bcc v1] Physical Resizable BAR
		BAR 0: current size: 16MB, supported: 16MB
		BAR 1: current size: 128GB, supported: 64MB 128MB 256MB 512MB 1GB 2GB 4GB 8GB 16GB 32GB 64GB 128GB
		BAR 3: current size: 32MB, supported: 32MB
	Kernel driver in use: nvidia
	Kernel modules: nvidiafb, nouveau, nvidia_drm, nvidia

0000:44:00.0 3D controller: NVIDIA Corporation GH100 [H100 PCIe] (rev a1)
	Subsystem: NVIDIA Corporation Device 1839
	Capabilities: [78] Express (v2) Endpoint, MSI 00
		DevCap:	MaxPayload 256 bytes, PhantFunc 0, Latency L0s unlimited, L1 <64us
		DevCtl:	CorrErr- NonFatalErr- FatalErr- UnsupReq-
			RlxdOrd- ExtTag+ PhantFunc- AuxPwr- NoSnoop+ FLReset-
			MaxPayload 128 bytes, MaxReadReq 128 bytes
	Capabilities: [bcc v1] Physical Resizable BAR
		BAR 0: current size: 16MB, supported: 16MB
		BAR 1: current size: 256MB, supported: 64MB 128MB 256MB 512MB 1GB 2GB 4GB 8GB 16GB 32GB 64GB 128GB
	Kernel driver in use: nvidia
"""

# A consumer card, lspci without -D, run by a normal user: capabilities hidden.
UNPRIVILEGED = """\
01:00.0 VGA compatible controller: NVIDIA Corporation AD102 [GeForce RTX 4090] (rev a1) (prog-if 00 [VGA controller])
	Subsystem: Micro-Star International Co., Ltd. [MSI] Device 5103
	Control: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+
	Region 1: Memory at 6000000000 (64-bit, prefetchable) [size=256M]
	Capabilities: <access denied>
	Kernel driver in use: nvidia
	Kernel modules: nouveau, nvidia_drm, nvidia

01:00.1 Audio device: NVIDIA Corporation AD102 High Definition Audio Controller (rev a1)
	Capabilities: <access denied>
	Kernel driver in use: snd_hda_intel
"""

DMIDECODE = """\
# dmidecode 3.5
Getting SMBIOS data from sysfs.
SMBIOS 3.5.0 present.

Handle 0x0000, DMI type 0, 26 bytes
BIOS Information
	Vendor: American Megatrends International, LLC.
	Version: 2.1a
	Release Date: 01/02/2024
	Address: 0xF0000
	Runtime Size: 64 kB
	ROM Size: 32 MB
	Characteristics:
		PCI is supported
		BIOS is upgradeable
	BIOS Revision: 5.27

Handle 0x0001, DMI type 13, 22 bytes
BIOS Language Information
	Version: 3
"""

GPU_A, GPU_B = "0000:43:00.0", "0000:44:00.0"
CHAINS = {
    GPU_A: "pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:00.0/0000:43:00.0",
    GPU_B: "pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:01.0/0000:44:00.0",
}


def sysfs_tree(root: Path) -> Path:
    """Two NVIDIA GPUs behind the switch, linked under /sys/bus/pci/devices as on a host."""
    files = {}
    for chain in CHAINS.values():
        base = f"/sys/devices/{chain}"
        files.update({f"{base}/vendor": "0x10de", f"{base}/class": "0x030200"})
        files.update(
            {f"{base}/current_link_speed": "32.0 GT/s PCIe", f"{base}/max_link_width": "16"}
        )
    links = {f"/sys/bus/pci/devices/{a}": f"../../../devices/{c}" for a, c in CHAINS.items()}
    return lay_out(root, files, links)


def two_gpus(tmp_path: Path, fixture: str = "h200-passthrough-vm") -> SimulatedNvml:
    """A simulated host with two GPUs of `fixture` at the sample's two addresses."""
    doc = load_fixture(fixture)
    first = doc["devices"][0]
    doc["devices"] = [copy.deepcopy(first), copy.deepcopy(first)]
    for i, address in enumerate((GPU_A, GPU_B)):
        doc["devices"][i]["fields"]["pci_bus_id"] = "0000" + address
        doc["devices"][i]["fields"]["uuid"] = f"GPU-{i}"
    path = tmp_path / "two.json"
    path.write_text(json.dumps(doc))
    return SimulatedNvml.from_fixture(path)


def with_lspci(facts: HostFacts, text: str, root: Path) -> HostFacts:
    lspci = known(text, SOURCE)
    addresses = [g.pci_address for g in facts.gpus]
    return replace(
        facts, lspci=known(len(parse_lspci(text)), SOURCE),
        pcie_capabilities=pcie_capabilities(lspci, root, addresses),
    )  # fmt: skip


def check(results: list[CheckResult], check_id: str, subject: str = "gpu0") -> CheckResult:
    return next(r for r in results if r.id == check_id and r.subject.startswith(subject))


def test_parse_reads_payloads_relaxed_ordering_acs_and_resizable_bar() -> None:
    devices = parse_lspci(SWITCHED)
    assert list(devices) == [
        "0000:40:01.1",
        "0000:41:00.0",
        "0000:42:00.0",
        "0000:42:01.0",
        GPU_A,
        GPU_B,
    ]
    gpu = devices[GPU_A]
    assert (gpu.max_payload_supported, gpu.max_payload, gpu.max_read_request) == (256, 256, 512)
    assert gpu.relaxed_ordering is True and gpu.driver == "nvidia" and not gpu.access_denied
    assert [(b.index, b.current_bytes) for b in gpu.resizable_bars] == [
        (0, 16 << 20), (1, 128 << 30), (3, 32 << 20)
    ]  # fmt: skip
    assert gpu.resizable_bars[1].at_max and max(gpu.resizable_bars[1].supported_bytes) == 128 << 30
    assert gpu.acs_control is None
    other = devices[GPU_B]
    assert (other.max_payload, other.max_read_request, other.relaxed_ordering) == (128, 128, False)
    assert not other.resizable_bars[1].at_max
    root_port, downstream = devices["0000:40:01.1"], devices["0000:42:00.0"]
    assert root_port.acs_control["ReqRedir"] is False and root_port.acs_control["SrcValid"] is True
    assert (
        downstream.acs_control["ReqRedir"] is True and downstream.acs_control["CmpltRedir"] is True
    )
    assert devices["0000:41:00.0"].acs_control is None


def test_parse_without_domain_and_without_root() -> None:
    devices = parse_lspci(UNPRIVILEGED)
    assert list(devices) == ["0000:01:00.0", "0000:01:00.1"]
    gpu = devices["0000:01:00.0"]
    assert gpu.access_denied and gpu.max_read_request is None and gpu.relaxed_ordering is None
    assert gpu.description.startswith("VGA compatible controller: NVIDIA")
    assert size_bytes("256MB") == 256 << 20 and size_bytes("2GB") == 2 << 30
    with pytest.raises(ValueError, match="not a size"):
        size_bytes("lots")


def test_bridges_above_a_gpu_come_from_its_sysfs_path(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "root")
    assert upstream_bridges(root, GPU_A).value == ["0000:40:01.1", "0000:41:00.0", "0000:42:00.0"]
    flat = lay_out(tmp_path / "flat", {"/sys/bus/pci/devices/0000:01:00.0/vendor": "0x10de"}, {})
    assert "cannot resolve" in upstream_bridges(flat, "0000:01:00.0").reason


def test_capability_facts_per_gpu_name_the_redirecting_bridges(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "root")
    caps = pcie_capabilities(known(SWITCHED, SOURCE), root, [GPU_A, GPU_B])
    a, b = caps
    assert a.acs_redirect.value == {"0000:42:00.0": ["ReqRedir", "CmpltRedir"]}
    assert b.acs_redirect.value == {"0000:42:01.0": ["ReqRedir", "CmpltRedir"]}
    assert a.resizable_bar.value == {"bar": 1, "current_bytes": 128 << 30, "max_bytes": 128 << 30}
    assert b.max_read_request.value == 128 and b.relaxed_ordering.value is False
    hidden = pcie_capabilities(known(UNPRIVILEGED, SOURCE), root, ["0000:01:00.0", GPU_A])
    assert "access denied" in hidden[0].max_payload.reason
    assert "not in lspci output" in hidden[1].resizable_bar.reason
    absent = pcie_capabilities(read_lspci(root), root, [GPU_A])[0]
    assert "not run" in absent.max_read_request.reason and absent.upstream.known


def test_checks_warn_on_acs_redirect_small_read_requests_and_a_small_bar(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "root")
    facts = with_lspci(gather_facts(two_gpus(tmp_path), root=root), SWITCHED, root)
    results = run_checks(facts)
    acs = check(results, "gpu.pcie_acs")
    assert acs.status == "warn" and "0000:42:00.0: ReqRedir, CmpltRedir" in acs.actual
    assert acs.needs == "bios" and "ACS" in acs.fix
    assert check(results, "gpu.pcie_max_read_request").status == "pass"
    assert check(results, "gpu.pcie_max_read_request", "gpu1").status == "warn"
    assert check(results, "gpu.pcie_max_payload", "gpu1").status == "warn"
    assert check(results, "gpu.pcie_max_payload").status == "pass"
    # the H200 fixture's BAR1 (256 GiB) maps its whole framebuffer: NVML alone says so
    assert check(results, "gpu.resizable_bar").status == "pass"

    clean = SWITCHED.replace("ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n\tKernel", "ReqRedir- CmpltRedir- UpstreamFwd+ EgressCtrl- DirectTrans-\n\tKernel")  # fmt: skip
    clean_results = run_checks(with_lspci(gather_facts(two_gpus(tmp_path), root=root), clean, root))
    assert check(clean_results, "gpu.pcie_acs").status == "pass"


def test_resizable_bar_from_nvml_and_lspci_on_a_consumer_card(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "root")
    plain = run_checks(gather_facts(two_gpus(tmp_path, "rtx4090-consumer"), root=root))
    bar = check(plain, "gpu.resizable_bar")
    assert bar.status == "warn" and bar.actual == "256 MiB of 23.9883 GiB" and bar.needs == "bios"
    facts = with_lspci(
        gather_facts(two_gpus(tmp_path, "rtx4090-consumer"), root=root), SWITCHED, root
    )
    small = check(run_checks(facts), "gpu.resizable_bar", "gpu1")
    assert small.status == "warn" and "not at its largest" in small.message


def test_without_lspci_facts_the_checks_say_why(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "root")
    results = run_checks(gather_facts(two_gpus(tmp_path), root=root))
    for check_id in ("gpu.pcie_acs", "gpu.pcie_max_read_request", "gpu.pcie_max_payload"):
        result = check(results, check_id)
        assert result.status == "unknown" and "not run: facts root is" in result.message
    single = run_checks(gather_facts(SimulatedNvml.from_fixture("h200-passthrough-vm"), root=root))
    assert check(single, "gpu.pcie_acs").status == "pass"  # one GPU: no peer-to-peer


def test_dmidecode_bios_text_parses_and_absent_lines_are_named() -> None:
    bios = parse_dmidecode_bios(DMIDECODE)
    assert bios == {
        "smbios_version": "3.5.0",
        "vendor": "American Megatrends International, LLC.",
        "version": "2.1a",
        "release_date": "01/02/2024",
        "bios_revision": "5.27",
    }
    assert parse_dmidecode_bios("# dmidecode 3.5\n") == {}


def test_root_only_tools_are_unknown_for_a_normal_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in read_lspci(Path("/")).reason
    facts = gather_facts()
    assert facts.bios is not None and "needs root" in facts.bios.version.reason
    assert "needs root" in facts.lspci.reason
    json.dumps(facts.to_dict())


def test_a_fake_root_never_runs_the_tools(tmp_path: Path) -> None:
    facts = gather_facts(root=sysfs_tree(tmp_path / "root"))
    assert "not run" in facts.bios.vendor.reason and "not run" in facts.lspci.reason
    assert [c.address for c in facts.pcie_capabilities] == [GPU_A, GPU_B]
    assert facts.pcie_capabilities[0].upstream.value[-1] == "0000:42:00.0"

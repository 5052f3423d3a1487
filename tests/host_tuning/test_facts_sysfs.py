"""Facts from fake sysfs/procfs trees: values read, and unknowns with their reasons."""

from __future__ import annotations

import json
from pathlib import Path

from host_tuning.facts import gather_facts, iommu_params
from host_tuning.pci import link_generation, sysfs_address
from tests.host_tuning.fake_host import GPU, FakeTree, make_unreadable


def test_healthy_tree_reads_every_section(fake_tree: FakeTree) -> None:
    facts = gather_facts(root=fake_tree())
    assert facts.cpu.governor.value == "performance"
    assert facts.cpu.boost.value is True
    assert facts.cpu.model.value == "Test CPU"
    assert facts.cpu.smt_active.value is True
    assert facts.memory.thp_enabled.value == "madvise"
    assert facts.memory.numa_balancing.value == 0
    assert facts.memory.numa_nodes.value == 1
    assert facts.kernel.iommu_params.value == {"intel_iommu": "on", "iommu": "pt"}
    assert facts.kernel.iommu_groups.value == 1
    assert facts.dmi.bios_version.value == "2.1"
    assert facts.virtualization.kind.value == "bare-metal"
    assert facts.virtualization.container.value is False
    json.dumps(facts.to_dict())


def test_nvidia_pci_device_link_numa_and_iommu(fake_tree: FakeTree) -> None:
    facts = gather_facts(root=fake_tree())
    assert [d.address for d in facts.pci_devices] == ["0000:00:06.0"]
    gpu = facts.pci_gpus[0]
    assert gpu.current_link_gen.value == 5 and gpu.max_link_gen.value == 5
    assert gpu.current_link_width.value == 16
    assert gpu.numa_node.value == 0
    assert gpu.local_cpulist.value == "0-1"
    assert gpu.driver.value == "nvidia"
    assert gpu.iommu_group.value == "7"
    assert gpu.iommu_group_type.value == "identity"


def test_fake_root_never_probes_nvml_or_runs_tools(fake_tree: FakeTree) -> None:
    root = fake_tree()
    facts = gather_facts(root=root)
    assert facts.gpus == []
    assert not facts.driver.nvml.known
    assert f"facts root is {root}" in facts.driver.nvml.reason
    assert "not run" in facts.virtualization.systemd_detect_virt_vm.reason
    assert all(not t.known for t in facts.tools.values())


def test_missing_cpufreq_is_unknown_with_the_missing_path(fake_tree: FakeTree) -> None:
    root = fake_tree(
        {
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": None,
            "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": None,
            "/sys/devices/system/cpu/cpufreq/boost": None,
        }
    )
    facts = gather_facts(root=root)
    assert facts.cpu.governor.value is None
    assert (
        "missing: /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
        in facts.cpu.governor.reason
    )
    assert "no_turbo" in facts.cpu.boost.reason


def test_mixed_governors_and_intel_no_turbo(fake_tree: FakeTree) -> None:
    root = fake_tree(
        {
            "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "powersave",
            "/sys/devices/system/cpu/cpufreq/boost": None,
            "/sys/devices/system/cpu/intel_pstate/no_turbo": "1",
        }
    )
    facts = gather_facts(root=root)
    assert facts.cpu.governor.value == "mixed: performance, powersave"
    assert facts.cpu.boost.value is False


def test_unreadable_file_is_unknown_with_permission_reason(fake_tree: FakeTree) -> None:
    root = fake_tree()
    make_unreadable(root / "sys/kernel/mm/transparent_hugepage/enabled")
    facts = gather_facts(root=root)
    assert facts.memory.thp_enabled.value is None
    assert facts.memory.thp_enabled.reason == (
        "permission denied: /sys/kernel/mm/transparent_hugepage/enabled"
    )


def test_directory_in_place_of_a_file_and_garbage_values(fake_tree: FakeTree) -> None:
    root = fake_tree(
        {"/proc/sys/kernel/numa_balancing": "lots", f"{GPU}/current_link_speed": "Unknown"}
    )
    (root / "proc/cmdline").unlink()
    (root / "proc/cmdline").mkdir()
    facts = gather_facts(root=root)
    assert "is a directory" in facts.kernel.cmdline.reason
    assert not facts.kernel.iommu_params.known
    assert "cannot parse 'lots'" in facts.memory.numa_balancing.reason
    assert facts.pci_gpus[0].current_link_speed.value == "Unknown"
    assert "not a PCIe link speed" in facts.pci_gpus[0].current_link_gen.reason


def test_empty_root_gives_unknowns_not_crashes(tmp_path: Path) -> None:
    facts = gather_facts(root=tmp_path)
    plain = facts.to_dict()
    json.dumps(plain)
    assert facts.pci_devices == [] and not facts.pci_bus.known
    assert not facts.cpu.governor.known
    assert not facts.virtualization.kind.known
    assert "no evidence either way" in facts.virtualization.kind.reason
    assert plain["memory"]["thp_enabled"]["unknown"].startswith("missing:")


def test_vm_and_container_evidence(fake_tree: FakeTree) -> None:
    root = fake_tree(
        {
            "/proc/cpuinfo": "model name\t: Xeon\nflags\t\t: fpu hypervisor avx2\n",
            "/sys/class/dmi/id/sys_vendor": "QEMU",
            "/proc/1/cgroup": "0::/kubepods/besteffort/pod1234\n",
            "/.dockerenv": "",
        }
    )
    virt = gather_facts(root=root).virtualization
    assert virt.cpu_hypervisor_flag.value is True
    assert virt.kind.value == "vm"
    assert "CPUID hypervisor flag" in virt.kind.source and "QEMU" in virt.kind.source
    assert virt.container.value is True
    assert "/.dockerenv" in virt.container.source and "cgroup" in virt.container.source


def test_metal_instance_of_a_cloud_vendor_is_not_a_vm(fake_tree: FakeTree) -> None:
    root = fake_tree(
        {"/sys/class/dmi/id/sys_vendor": "Amazon EC2", "/sys/class/dmi/id/product_name": "p5.metal"}
    )
    assert gather_facts(root=root).virtualization.kind.value == "bare-metal"


def test_parsers() -> None:
    assert link_generation("16.0 GT/s PCIe") == 4
    assert link_generation("2.5 GT/s") == 1
    assert sysfs_address("00000000:00:06.0") == "0000:00:06.0"
    assert sysfs_address("00000001:A1:00.0") == "0001:a1:00.0"
    assert iommu_params("ro amd_iommu=on iommu.passthrough=1 -- iommu=pt") == {
        "amd_iommu": "on",
        "iommu.passthrough": "1",
    }

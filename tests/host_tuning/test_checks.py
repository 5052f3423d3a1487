"""Checks over facts from the simulated devices and fake sysfs trees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from host_tuning.checks import (
    NEEDS,
    NO_DRIVER,
    RULES,
    SEVERITIES,
    STATUSES,
    CheckResult,
    check_pcie_under_load,
    run_checks,
)
from host_tuning.facts import gather_facts
from host_tuning.families import FAMILIES, gpu_family
from host_tuning.nvml import SimulatedNvml
from tests.host_tuning.fake_host import GPU, FakeTree

H200 = "h200-passthrough-vm"
RTX = "rtx4090-consumer"


def checks(root: Path, fixture: str | None = H200, **overrides: Any) -> list[CheckResult]:
    nvml = SimulatedNvml.from_fixture(fixture, overrides=overrides) if fixture else None
    return run_checks(gather_facts(nvml, root=root))


def one(results: list[CheckResult], check_id: str) -> CheckResult:
    found = [r for r in results if r.id == check_id]
    assert len(found) == 1, [(r.id, r.subject) for r in found]
    return found[0]


def test_recorded_h200_passes_pcie_and_warns_on_passthrough(fake_tree: FakeTree) -> None:
    results = checks(fake_tree())
    for r in results:
        assert r.status in STATUSES and r.needs in NEEDS and r.severity in SEVERITIES
    assert one(results, "gpu.pcie_gen").status == "pass"
    width = one(results, "gpu.pcie_width")
    assert (width.status, width.actual, width.recommended) == ("pass", "x16 (max x16)", "x16")
    assert one(results, "gpu.pcie_gen").recommended == "Gen5"
    virt = one(results, "host.virtualization")
    assert virt.status == "warn"
    assert "GPU passed through into a VM" in virt.message
    assert virt.fix
    driver = one(results, "gpu.driver")
    assert driver.status == "pass" and driver.actual == "580.159.04"
    for check_id in (
        "gpu.persistence",
        "gpu.ecc",
        "gpu.mig",
        "gpu.power_limit",
        "gpu.clock_events",
    ):
        assert one(results, check_id).status == "pass", check_id
    assert one(results, "gpu.pcie_gen").subject == "gpu0 (0000:00:06.0)"


def test_link_at_x8_fails(fake_tree: FakeTree) -> None:
    width = one(checks(fake_tree(), pcie_link_width_current=8), "gpu.pcie_width")
    assert width.status == "fail"
    assert width.actual == "x8 (max x16)"
    assert width.needs == "bios" and width.fix


def test_slow_link_warns_at_idle_and_fails_under_load(fake_tree: FakeTree) -> None:
    idle = one(checks(fake_tree(), pcie_link_gen_current=1), "gpu.pcie_gen")
    assert idle.status == "warn"
    assert "re-check under load" in idle.message
    busy = one(
        checks(fake_tree(), pcie_link_gen_current=4, clock_event_reasons_current=0), "gpu.pcie_gen"
    )
    assert busy.status == "fail"


def test_check_pcie_under_load_reads_now_and_is_strict() -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    assert [r.status for r in check_pcie_under_load(nvml, 0)] == ["pass", "pass"]
    nvml.set_field(0, "pcie_link_gen_current", 4)
    gen, width = check_pcie_under_load(nvml, 0)
    assert (gen.id, gen.status, width.status) == ("gpu.pcie_gen", "fail", "pass")
    nvml.set_field(0, "pcie_link_width_current", {"nvml_error": "Not Supported"})
    assert check_pcie_under_load(nvml, 0)[1].status == "unknown"


def test_slot_capping_the_gpu_generation_warns(fake_tree: FakeTree) -> None:
    slot = one(checks(fake_tree(), pcie_link_gen_max=4, pcie_link_gen_current=4), "gpu.pcie_slot")
    assert slot.status == "warn" and slot.needs == "bios"
    assert "Gen4" in slot.message and "Gen5" in slot.message


def test_ecc_pending_change_and_family_recommendation(fake_tree: FakeTree) -> None:
    pending = one(checks(fake_tree(), ecc_mode=[1, 0]), "gpu.ecc")
    assert pending.status == "warn" and pending.needs == "reboot"
    off_on_h200 = one(checks(fake_tree(), ecc_mode=[0, 0]), "gpu.ecc")
    assert off_on_h200.status == "warn" and off_on_h200.recommended == "enabled"
    off_on_rtx = one(checks(fake_tree(), RTX), "gpu.ecc")
    assert off_on_rtx.status == "pass" and off_on_rtx.recommended == "disabled"


def test_mig(fake_tree: FakeTree) -> None:
    assert one(checks(fake_tree(), mig_mode=[1, 1]), "gpu.mig").status == "warn"
    pending = one(checks(fake_tree(), mig_mode=[0, 1]), "gpu.mig")
    assert pending.status == "warn" and "next GPU reset" in pending.message
    assert one(checks(fake_tree(), RTX), "gpu.mig").actual == "not supported"


def test_power_limits(fake_tree: FakeTree) -> None:
    low = one(checks(fake_tree(), power_limit_mw=500000), "gpu.power_limit")
    assert low.status == "warn" and "500 W" in low.message
    capped = one(checks(fake_tree(), power_limit_enforced_mw=400000), "gpu.power_limit")
    assert capped.status == "warn" and "400 W" in capped.message
    rtx = one(checks(fake_tree(), RTX), "gpu.power_limit")
    assert rtx.status == "pass" and "600 W" in rtx.message


def test_clock_event_reasons(fake_tree: FakeTree) -> None:
    hot = one(checks(fake_tree(), clock_event_reasons_current=0x20), "gpu.clock_events")
    assert hot.status == "fail" and "sw_thermal_slowdown" in hot.message
    capped = one(checks(fake_tree(), clock_event_reasons_current=0x4), "gpu.clock_events")
    assert capped.status == "warn" and "sw_power_cap" in capped.message


def test_persistence_compute_mode_and_processes(fake_tree: FakeTree) -> None:
    results = checks(fake_tree(), RTX, compute_mode=2, compute_processes=[4242])
    persistence = one(results, "gpu.persistence")
    assert persistence.status == "warn" and "nvidia-smi -pm 1" in persistence.fix
    assert one(results, "gpu.compute_mode").status == "fail"
    procs = one(results, "gpu.processes")
    assert procs.status == "warn" and "4242" in procs.message


def test_unreadable_getter_gives_unknown_with_reason(fake_tree: FakeTree) -> None:
    result = one(
        checks(fake_tree(), persistence_mode={"nvml_error": "Insufficient Permissions"}),
        "gpu.persistence",
    )
    assert result.status == "unknown"
    assert result.message == "cannot read persistence mode: NVML: Insufficient Permissions"


def test_host_rules_on_fake_trees(fake_tree: FakeTree) -> None:
    results = checks(
        fake_tree(
            {
                "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "powersave",
                "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "powersave",
                "/sys/kernel/mm/transparent_hugepage/enabled": "always madvise [never]",
                "/proc/sys/kernel/numa_balancing": "1",
                "/sys/devices/system/node/node1/cpulist": "2-3",
                "/sys/kernel/iommu_groups/7/type": "DMA-FQ",
                "/sys/devices/system/cpu/cpufreq/boost": "0",
            }
        ),
        fixture=None,
    )
    governor = one(results, "cpu.governor")
    assert (governor.status, governor.actual, governor.recommended) == (
        "warn",
        "powersave",
        "performance",
    )
    assert "cpupower" in governor.fix
    for check_id in ("memory.thp", "memory.numa_balancing", "iommu.passthrough", "cpu.boost"):
        assert one(results, check_id).status == "warn", check_id
    assert one(results, "iommu.passthrough").needs == "reboot"


def test_healthy_bare_metal_host_rules_pass(fake_tree: FakeTree) -> None:
    results = checks(fake_tree(), fixture=None)
    for check_id in (
        "cpu.governor",
        "cpu.boost",
        "memory.thp",
        "memory.numa_balancing",
        "iommu.passthrough",
        "host.virtualization",
    ):
        assert one(results, check_id).status == "pass", check_id


def test_missing_cpufreq_is_unknown_with_reason(fake_tree: FakeTree) -> None:
    root = fake_tree(
        {
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": None,
            "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": None,
        }
    )
    governor = one(checks(root, fixture=None), "cpu.governor")
    assert governor.status == "unknown"
    assert "cpufreq not exposed" in governor.message and "scaling_governor" in governor.message


def test_iommu_translate_mode_from_the_command_line(fake_tree: FakeTree) -> None:
    root = fake_tree({"/proc/cmdline": "root=/dev/sda1 intel_iommu=on"})
    (root / "sys/kernel/iommu_groups/7/type").unlink()
    result = one(checks(root, fixture=None), "iommu.passthrough")
    assert result.status == "warn" and result.actual == "intel_iommu=on"


def test_gpu_on_the_bus_without_driver_fails_and_sysfs_link_is_checked(
    fake_tree: FakeTree,
) -> None:
    root = fake_tree(
        {f"{GPU}/current_link_width": "8", f"{GPU}/current_link_speed": "2.5 GT/s PCIe"}
    )
    results = checks(root, fixture=None)
    driver = one(results, "gpu.driver")
    assert driver.status == "fail"
    assert driver.message.startswith(f"{NO_DRIVER}: ")
    assert "1 NVIDIA GPU(s) on the PCI bus" in driver.message
    gen, width = one(results, "gpu.pcie_gen"), one(results, "gpu.pcie_width")
    assert gen.subject == "pci 0000:00:06.0"
    assert gen.status == "warn" and "re-check under load" in gen.message
    assert width.status == "fail"


def test_no_gpu_and_no_driver_still_answers(fake_tree: FakeTree) -> None:
    root = fake_tree({f"{GPU}/vendor": "0x1af4"})
    results = checks(root, fixture=None)
    driver = one(results, "gpu.driver")
    assert driver.status == "unknown"
    assert driver.message.startswith(f"{NO_DRIVER}: ")
    assert not [r for r in results if r.subject != "host"]


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("NVIDIA H200", "H100/H200"),
        ("NVIDIA H100 80GB HBM3", "H100/H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090/5090"),
        ("NVIDIA GeForce RTX 5090", "RTX 4090/5090"),
        ("NVIDIA GeForce RTX 3090", "other"),
        (None, "other"),
    ],
)
def test_gpu_family(name: str | None, family: str) -> None:
    assert gpu_family(name) == family


def test_rule_table_is_well_formed() -> None:
    for rule in RULES:
        assert "*" in rule.recommended, rule.id
        assert set(rule.recommended) - {"*"} <= set(FAMILIES), rule.id
        assert rule.severity in SEVERITIES and rule.needs in NEEDS, rule.id
        assert rule.scope in ("host", "gpu", "pci_gpu") and rule.reads and rule.fix, rule.id

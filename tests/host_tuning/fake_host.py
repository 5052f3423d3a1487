"""A fake sysfs/procfs tree (real files) laid out like a healthy bare-metal GPU host."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

GPU = "/sys/bus/pci/devices/0000:00:06.0"  # where the H200 fixture sits

HEALTHY: dict[str, str] = {
    "/proc/cpuinfo": "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse avx2\n",
    "/proc/cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt quiet",
    "/proc/sys/kernel/osrelease": "6.8.0-test",
    "/proc/sys/kernel/numa_balancing": "0",
    "/proc/1/cgroup": "0::/init.scope\n",
    "/sys/devices/system/cpu/online": "0-1",
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "performance",
    "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "performance",
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_driver": "acpi-cpufreq",
    "/sys/devices/system/cpu/cpufreq/boost": "1",
    "/sys/devices/system/cpu/smt/control": "on",
    "/sys/devices/system/cpu/smt/active": "1",
    "/sys/devices/system/cpu/cpuidle/current_driver": "intel_idle",
    "/sys/devices/system/node/node0/cpulist": "0-1",
    "/sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never",
    "/sys/kernel/mm/transparent_hugepage/defrag": "always defer defer+madvise [madvise] never",
    "/sys/kernel/iommu_groups/7/type": "identity",
    "/sys/class/dmi/id/sys_vendor": "Supermicro",
    "/sys/class/dmi/id/product_name": "SYS-421GE-TNRT",
    "/sys/class/dmi/id/board_vendor": "Supermicro",
    "/sys/class/dmi/id/board_name": "X13DEG-OAD",
    "/sys/class/dmi/id/bios_vendor": "American Megatrends International, LLC.",
    "/sys/class/dmi/id/bios_version": "2.1",
    "/sys/class/dmi/id/bios_date": "01/02/2024",
    f"{GPU}/vendor": "0x10de",
    f"{GPU}/device": "0x2335",
    f"{GPU}/class": "0x030200",
    f"{GPU}/current_link_speed": "32.0 GT/s PCIe",
    f"{GPU}/max_link_speed": "32.0 GT/s PCIe",
    f"{GPU}/current_link_width": "16",
    f"{GPU}/max_link_width": "16",
    f"{GPU}/numa_node": "0",
    f"{GPU}/local_cpulist": "0-1",
    "/sys/bus/pci/devices/0000:00:00.0/vendor": "0x8086",
    "/sys/bus/pci/devices/0000:00:00.0/class": "0x060000",
}
LINKS: dict[str, str] = {
    f"{GPU}/iommu_group": "../../../../kernel/iommu_groups/7",
    f"{GPU}/driver": "../../../../bus/pci/drivers/nvidia",
}

FakeTree = Callable[..., Path]


def lay_out(root: Path, files: dict[str, str | None], links: dict[str, str]) -> Path:
    """Write `files` (None: leave out) and symlinks under `root`."""
    for path, text in files.items():
        if text is None:
            continue
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text + "\n")
    for path, dest in links.items():
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dest)
    return root


def make_unreadable(path: Path) -> None:
    """Make `path` unreadable for this process: chmod 000, or for root a write-only sysfs file."""
    if os.geteuid() != 0:
        path.chmod(0)
        return
    write_only = Path("/sys/bus/pci/rescan")
    if not write_only.exists():
        pytest.skip("running as root and no write-only sysfs file to point at")
    path.unlink()
    path.symlink_to(write_only)

"""NVIDIA PCI devices as sysfs shows them: link speed and width, NUMA node, IOMMU group.

This is what the host says about its GPUs even when no NVIDIA driver is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from host_tuning.fact import Fact, known, link_name, list_dir, read_text, unknown

NVIDIA_VENDOR = "0x10de"
PCI_DEVICES = "/sys/bus/pci/devices"

# GT/s per lane -> PCIe generation
_GEN_BY_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def link_generation(speed: str) -> int:
    """PCIe generation from a sysfs speed string such as '32.0 GT/s PCIe'."""
    match = re.match(r"\s*([\d.]+)\s*GT/s", speed)
    if not match or float(match.group(1)) not in _GEN_BY_RATE:
        raise ValueError(f"not a PCIe link speed: {speed!r}")
    return _GEN_BY_RATE[float(match.group(1))]


def sysfs_address(nvml_bus_id: str) -> str:
    """NVML's '00000000:00:06.0' as sysfs names it: '0000:00:06.0'."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else nvml_bus_id.lower()


@dataclass(frozen=True)
class PciDeviceFacts:
    """One PCI function of vendor NVIDIA."""

    address: str
    device_id: Fact
    class_code: Fact
    current_link_speed: Fact
    current_link_gen: Fact
    current_link_width: Fact
    max_link_speed: Fact
    max_link_gen: Fact
    max_link_width: Fact
    numa_node: Fact
    local_cpulist: Fact
    driver: Fact
    iommu_group: Fact
    iommu_group_type: Fact

    @property
    def is_gpu(self) -> bool:
        """A display or 3D controller (class 0x03xxxx), not the audio or bridge functions."""
        return self.class_code.known and str(self.class_code.value).startswith("0x03")


def _device(root: Path, address: str) -> PciDeviceFacts:
    base = f"{PCI_DEVICES}/{address}"
    cur_speed = read_text(root, f"{base}/current_link_speed")
    max_speed = read_text(root, f"{base}/max_link_speed")
    group = link_name(root, f"{base}/iommu_group")
    group_type = (
        read_text(root, f"/sys/kernel/iommu_groups/{group.value}/type")
        if group.known
        else unknown(f"no IOMMU group: {group.reason}", f"{base}/iommu_group")
    )
    return PciDeviceFacts(
        address=address,
        device_id=read_text(root, f"{base}/device"),
        class_code=read_text(root, f"{base}/class"),
        current_link_speed=cur_speed,
        current_link_gen=cur_speed.map(link_generation),
        current_link_width=read_text(root, f"{base}/current_link_width").map(int),
        max_link_speed=max_speed,
        max_link_gen=max_speed.map(link_generation),
        max_link_width=read_text(root, f"{base}/max_link_width").map(int),
        numa_node=read_text(root, f"{base}/numa_node").map(int),
        local_cpulist=read_text(root, f"{base}/local_cpulist"),
        driver=link_name(root, f"{base}/driver"),
        iommu_group=group,
        iommu_group_type=group_type,
    )


def nvidia_pci_devices(root: Path) -> tuple[list[PciDeviceFacts], Fact]:
    """Every NVIDIA PCI function, and a fact saying whether the PCI bus could be listed."""
    listing = list_dir(root, PCI_DEVICES)
    if not listing.known:
        return [], listing
    devices = [
        _device(root, address)
        for address in listing.value
        if read_text(root, f"{PCI_DEVICES}/{address}/vendor").value == NVIDIA_VENDOR
    ]
    return devices, known(len(devices), PCI_DEVICES)

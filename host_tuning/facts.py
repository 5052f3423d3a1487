"""Host facts: GPUs (NVML, else sysfs), CPU, memory, kernel, IOMMU, virtualization, DMI.

`gather_facts()` reads everything it can without root and never raises: what it
cannot read is an unknown `Fact` with the reason. `root` is the filesystem root
(a fake sysfs/procfs tree in tests); host tools only run when it is "/". Two
sources need root: PCIe capabilities (lspci -vvv) and BIOS details (dmidecode).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host_tuning.fact import (
    REAL_ROOT,
    Fact,
    exists,
    known,
    list_dir,
    read_int,
    read_text,
    run_tool,
    to_plain,
    unknown,
)
from host_tuning.families import gpu_family
from host_tuning.lspci import PcieCapabilityFacts, parse_lspci, pcie_capabilities, read_lspci
from host_tuning.nvml_base import DEVICE_FIELDS, SYSTEM_FIELDS, NvmlBackend, NvmlError
from host_tuning.nvml_real import probe_nvml
from host_tuning.pci import PciDeviceFacts, nvidia_pci_devices, sysfs_address

CPU = "/sys/devices/system/cpu"
THP = "/sys/kernel/mm/transparent_hugepage"
DMI = "/sys/class/dmi/id"
VM_VENDORS = (
    "qemu",
    "kvm",
    "vmware",
    "xen",
    "innotek",
    "virtualbox",
    "microsoft corporation",
    "openstack",
    "google",
    "amazon ec2",
    "bochs",
    "parallels",
    "firecracker",
)
CONTAINER_CGROUP_MARKERS = ("docker", "kubepods", "containerd", "libpod", "lxc", "crio")
IOMMU_PARAMS = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict")
TOOLS = ("nvidia-smi", "lspci", "dmidecode", "systemd-detect-virt", "numactl", "cpupower")


@dataclass(frozen=True)
class DriverFacts:
    nvml: Fact  # "real"/"simulated", or unknown with why NVML is absent
    driver_version: Fact
    nvml_version: Fact
    cuda_driver_version: Fact
    kernel_module_version: Fact  # /proc/driver/nvidia/version, present without NVML too
    gpu_count: Fact


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML reports it; `nvml` holds every field of nvml_base.DEVICE_FIELDS."""

    index: int
    family: str
    pci_address: str | None  # sysfs form, to join with HostFacts.pci_devices
    nvml: dict[str, Fact]

    def get(self, name: str) -> Fact:
        return self.nvml[name]


@dataclass(frozen=True)
class CpuFacts:
    model: Fact
    online: Fact
    governor: Fact  # one name, or "mixed: a, b"
    scaling_driver: Fact
    energy_performance_preference: Fact
    boost: Fact  # True when turbo/boost is allowed
    smt_control: Fact
    smt_active: Fact
    cpuidle_driver: Fact


@dataclass(frozen=True)
class MemoryFacts:
    thp_enabled: Fact
    thp_defrag: Fact
    numa_balancing: Fact  # 0 off, 1+ on
    numa_nodes: Fact


@dataclass(frozen=True)
class KernelFacts:
    release: Fact
    cmdline: Fact
    iommu_params: Fact  # {param: value} from the command line
    iommu_groups: Fact  # number of IOMMU groups (0: IOMMU off or not exposed)


@dataclass(frozen=True)
class VirtualizationFacts:
    cpu_hypervisor_flag: Fact
    dmi_vendor: Fact
    systemd_detect_virt_vm: Fact
    systemd_detect_virt_container: Fact
    dockerenv: Fact
    containerenv: Fact
    cgroup_container_marker: Fact
    kind: Fact  # "vm" or "bare-metal"
    container: Fact  # True inside a container


@dataclass(frozen=True)
class DmiFacts:
    sys_vendor: Fact
    product_name: Fact
    board_vendor: Fact
    board_name: Fact
    bios_vendor: Fact
    bios_version: Fact
    bios_date: Fact


@dataclass(frozen=True)
class BiosFacts:
    """The BIOS as `dmidecode -t bios` reports it (root only); DmiFacts has what sysfs shows."""

    vendor: Fact
    version: Fact
    release_date: Fact
    bios_revision: Fact
    firmware_revision: Fact
    smbios_version: Fact


@dataclass(frozen=True)
class HostFacts:
    root: str
    collected_at: float
    driver: DriverFacts
    gpus: list[GpuFacts]
    pci_bus: Fact  # number of NVIDIA PCI functions, or why the bus could not be listed
    pci_devices: list[PciDeviceFacts]
    cpu: CpuFacts
    memory: MemoryFacts
    kernel: KernelFacts
    virtualization: VirtualizationFacts
    dmi: DmiFacts
    tools: dict[str, Fact] = field(default_factory=dict)
    lspci: Fact = field(default_factory=lambda: unknown("not read"))  # devices lspci listed
    pcie_capabilities: list[PcieCapabilityFacts] = field(default_factory=list)  # per GPU
    bios: BiosFacts | None = None

    def pcie_capabilities_for(self, address: str | None) -> PcieCapabilityFacts | None:
        return next((c for c in self.pcie_capabilities if c.address == address), None)

    @property
    def pci_gpus(self) -> list[PciDeviceFacts]:
        """NVIDIA display/3D controllers on the PCI bus (with or without a driver)."""
        return [d for d in self.pci_devices if d.is_gpu]

    def pci_for(self, gpu: GpuFacts) -> PciDeviceFacts | None:
        return next((d for d in self.pci_devices if d.address == gpu.pci_address), None)

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        for device, plain in zip(self.pci_devices, out["pci_devices"], strict=True):
            plain["is_gpu"] = device.is_gpu
        return out


def _fact_from_reading(backend: NvmlBackend, index: int, name: str) -> Fact:
    reading = backend.read(index, name)
    source = f"nvml:{name}"
    return known(reading.value, source) if reading.ok else unknown(reading.reason or "", source)


def _gpus(backend: NvmlBackend, count: int) -> list[GpuFacts]:
    gpus = []
    for index in range(count):
        nvml = {name: _fact_from_reading(backend, index, name) for name in DEVICE_FIELDS}
        bus = nvml["pci_bus_id"]
        gpus.append(
            GpuFacts(
                index=index,
                family=gpu_family(nvml["name"].value),
                pci_address=sysfs_address(bus.value) if bus.known else None,
                nvml=nvml,
            )
        )
    return gpus


def _driver(root: Path, backend: NvmlBackend | None, why_none: str) -> tuple[DriverFacts, int]:
    module = read_text(root, "/proc/driver/nvidia/version").map(lambda t: t.splitlines()[0])
    if backend is None:
        missing = unknown(f"no NVML: {why_none}", "nvml")
        return DriverFacts(missing, missing, missing, missing, module, missing), 0
    system = {}
    for name in SYSTEM_FIELDS:
        reading = backend.read_system(name)
        source = f"nvml:{name}"
        system[name] = (
            known(reading.value, source) if reading.ok else unknown(reading.reason or "", source)
        )
    try:
        count = backend.device_count()
        count_fact = known(count, "nvml:device_count")
    except NvmlError as err:
        count, count_fact = 0, unknown(str(err), "nvml:device_count")
    facts = DriverFacts(
        nvml=known(backend.kind, "nvml"),
        driver_version=system["driver_version"],
        nvml_version=system["nvml_version"],
        cuda_driver_version=system["cuda_driver_version"],
        kernel_module_version=module,
        gpu_count=count_fact,
    )
    return facts, count


def _cpu_dirs(root: Path) -> list[str]:
    listing = list_dir(root, CPU)
    return [n for n in listing.value or [] if re.fullmatch(r"cpu\d+", n)]


def _governor(root: Path) -> Fact:
    cpus = _cpu_dirs(root) or ["cpu0"]
    reads = [read_text(root, f"{CPU}/{cpu}/cpufreq/scaling_governor") for cpu in cpus]
    values = sorted({r.value for r in reads if r.known})
    source = f"{CPU}/cpu*/cpufreq/scaling_governor"
    if not values:
        return unknown(f"cpufreq not exposed (usual in VMs): {reads[0].reason}", source)
    return known(values[0] if len(values) == 1 else "mixed: " + ", ".join(values), source)


def _boost(root: Path) -> Fact:
    boost = read_int(root, f"{CPU}/cpufreq/boost")
    if boost.known:
        return known(boost.value == 1, boost.source)
    no_turbo = read_int(root, f"{CPU}/intel_pstate/no_turbo")
    if no_turbo.known:
        return known(no_turbo.value == 0, no_turbo.source)
    return unknown(f"{boost.reason}; {no_turbo.reason}", f"{CPU}/cpufreq/boost")


def _cpuinfo_field(root: Path, key: str) -> Fact:
    def first(text: str) -> str:
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key:
                return value.strip()
        raise ValueError(f"no {key!r} line")

    return read_text(root, "/proc/cpuinfo").map(first)


def _cpu(root: Path) -> CpuFacts:
    return CpuFacts(
        model=_cpuinfo_field(root, "model name"),
        online=read_text(root, f"{CPU}/online"),
        governor=_governor(root),
        scaling_driver=read_text(root, f"{CPU}/cpu0/cpufreq/scaling_driver"),
        energy_performance_preference=read_text(
            root, f"{CPU}/cpu0/cpufreq/energy_performance_preference"
        ),
        boost=_boost(root),
        smt_control=read_text(root, f"{CPU}/smt/control"),
        smt_active=read_int(root, f"{CPU}/smt/active").map(lambda v: v == 1),
        cpuidle_driver=read_text(root, f"{CPU}/cpuidle/current_driver"),
    )


def bracketed(text: str) -> str:
    """The selected word of a sysfs choice list: 'always [madvise] never' -> 'madvise'."""
    match = re.search(r"\[([^\]]+)\]", text)
    if not match:
        raise ValueError("no [selected] choice")
    return match.group(1)


def _memory(root: Path) -> MemoryFacts:
    nodes = list_dir(root, "/sys/devices/system/node").map(
        lambda names: len([n for n in names if re.fullmatch(r"node\d+", n)])
    )
    return MemoryFacts(
        thp_enabled=read_text(root, f"{THP}/enabled").map(bracketed),
        thp_defrag=read_text(root, f"{THP}/defrag").map(bracketed),
        numa_balancing=read_int(root, "/proc/sys/kernel/numa_balancing"),
        numa_nodes=nodes,
    )


def iommu_params(cmdline: str) -> dict[str, str]:
    """IOMMU-related parameters of a kernel command line ({"intel_iommu": "on", ...})."""
    params = {}
    for token in cmdline.split():
        if token == "--":
            break
        key, _, value = token.partition("=")
        if key in IOMMU_PARAMS:
            params[key] = value
    return params


def _kernel(root: Path) -> KernelFacts:
    cmdline = read_text(root, "/proc/cmdline")
    return KernelFacts(
        release=read_text(root, "/proc/sys/kernel/osrelease"),
        cmdline=cmdline,
        iommu_params=cmdline.map(iommu_params),
        iommu_groups=list_dir(root, "/sys/kernel/iommu_groups").map(len),
    )


def _dmi(root: Path) -> DmiFacts:
    names = [
        "sys_vendor",
        "product_name",
        "board_vendor",
        "board_name",
        "bios_vendor",
        "bios_version",
        "bios_date",
    ]
    return DmiFacts(**{name: read_text(root, f"{DMI}/{name}") for name in names})


DMIDECODE_BIOS = {
    "vendor": "Vendor",
    "version": "Version",
    "release_date": "Release Date",
    "bios_revision": "BIOS Revision",
    "firmware_revision": "Firmware Revision",
}


def parse_dmidecode_bios(text: str) -> dict[str, str]:
    """`dmidecode -t bios` text -> {"vendor": ..., "smbios_version": ...} (what it shows)."""
    out: dict[str, str] = {}
    smbios = re.search(r"^SMBIOS ([\d.]+) present", text, re.M)
    if smbios:
        out["smbios_version"] = smbios.group(1)
    section = text.split("BIOS Information", 1)[1] if "BIOS Information" in text else ""
    labels = {label: name for name, label in DMIDECODE_BIOS.items()}
    for line in section.splitlines()[1:]:
        if line and not line.startswith("\t"):
            break  # the next structure
        label, sep, value = line.strip().partition(":")
        if sep and label in labels and labels[label] not in out:
            out[labels[label]] = value.strip()
    return out


def _bios(root: Path) -> BiosFacts:
    source = "dmidecode -t bios"
    if root == REAL_ROOT and os.geteuid() != 0:
        text = unknown(
            "needs root: dmidecode reads the SMBIOS tables (sysfs dmi has vendor, version, date)",
            source,
        )
    else:
        text = run_tool(root, ["dmidecode", "-t", "bios"])
    parsed = text.map(parse_dmidecode_bios)

    def one(name: str) -> Fact:
        if not parsed.known:
            return parsed
        if name in parsed.value:
            return known(parsed.value[name], source)
        return unknown(f"dmidecode shows no {name.replace('_', ' ')}", source)

    return BiosFacts(**{name: one(name) for name in [*DMIDECODE_BIOS, "smbios_version"]})


def _hypervisor_flag(text: str) -> bool:
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "flags":
            return "hypervisor" in value.split()
    raise ValueError("no 'flags' line (not x86?)")


def _cgroup_marker(text: str) -> bool:
    return any(marker in text for marker in CONTAINER_CGROUP_MARKERS)


def _is_vm_vendor(dmi: DmiFacts) -> bool:
    text = " ".join(str(f.value) for f in (dmi.sys_vendor, dmi.product_name) if f.known).lower()
    return any(vendor in text for vendor in VM_VENDORS) and "metal" not in text


def _virtualization(root: Path, dmi: DmiFacts) -> VirtualizationFacts:
    flag = read_text(root, "/proc/cpuinfo").map(_hypervisor_flag)
    vm_tool = run_tool(root, ["systemd-detect-virt", "--vm"], ok_codes=(0, 1))
    ct_tool = run_tool(root, ["systemd-detect-virt", "--container"], ok_codes=(0, 1))
    dockerenv = exists(root, "/.dockerenv")
    containerenv = exists(root, "/run/.containerenv")
    cgroup = read_text(root, "/proc/1/cgroup").map(_cgroup_marker)
    dmi_vendor = dmi.sys_vendor

    vm_evidence = []
    if flag.value is True:
        vm_evidence.append("CPUID hypervisor flag")
    if vm_tool.known and vm_tool.value not in ("", "none"):
        vm_evidence.append(f"systemd-detect-virt --vm: {vm_tool.value}")
    if _is_vm_vendor(dmi):
        vm_evidence.append(f"DMI vendor {dmi_vendor.value or dmi.product_name.value}")
    if vm_evidence:
        kind = known("vm", "; ".join(vm_evidence))
    elif flag.value is False or vm_tool.value == "none":
        kind = known("bare-metal", "no hypervisor flag, no VM vendor")
    else:
        kind = unknown(f"no evidence either way: {flag.reason}; {vm_tool.reason}", "virtualization")

    ct_evidence = [
        name
        for name, fact in (
            ("/.dockerenv", dockerenv),
            ("/run/.containerenv", containerenv),
            ("container cgroup in /proc/1/cgroup", cgroup),
        )
        if fact.value is True
    ]
    if ct_tool.known and ct_tool.value not in ("", "none"):
        ct_evidence.append(f"systemd-detect-virt --container: {ct_tool.value}")
    if ct_evidence:
        container = known(True, "; ".join(ct_evidence))
    elif all(f.known for f in (dockerenv, containerenv, cgroup)):
        container = known(False, "no container markers")
    else:
        container = unknown(f"container markers unreadable: {cgroup.reason}", "virtualization")

    return VirtualizationFacts(
        cpu_hypervisor_flag=flag,
        dmi_vendor=dmi_vendor,
        systemd_detect_virt_vm=vm_tool,
        systemd_detect_virt_container=ct_tool,
        dockerenv=dockerenv,
        containerenv=containerenv,
        cgroup_container_marker=cgroup,
        kind=kind,
        container=container,
    )


def _tools(root: Path) -> dict[str, Fact]:
    if root != REAL_ROOT:
        return {t: unknown(f"not checked: facts root is {root}, not /", t) for t in TOOLS}
    out = {}
    for tool in TOOLS:
        path = shutil.which(tool)
        out[tool] = known(path, "PATH") if path else unknown("tool absent", "PATH")
    return out


def gather_facts(nvml: NvmlBackend | None = None, root: Path = REAL_ROOT) -> HostFacts:
    """Read the host. With `nvml` None, the real NVML is probed when `root` is "/"."""
    root = Path(root)
    opened: NvmlBackend | None = None
    why_none = f"not probed: facts root is {root}, not /"
    if nvml is None and root == REAL_ROOT:
        probe = probe_nvml()
        nvml = opened = probe.backend
        why_none = probe.reason or ""
    try:
        driver, count = _driver(root, nvml, why_none)
        gpus = _gpus(nvml, count) if nvml is not None else []
    finally:
        if opened is not None:
            opened.close()
    pci_devices, pci_bus = nvidia_pci_devices(root)
    dmi = _dmi(root)
    lspci = read_lspci(root)
    gpu_addresses = [d.address for d in pci_devices if d.is_gpu]
    return HostFacts(
        root=str(root),
        collected_at=time.time(),
        driver=driver,
        gpus=gpus,
        pci_bus=pci_bus,
        pci_devices=pci_devices,
        cpu=_cpu(root),
        memory=_memory(root),
        kernel=_kernel(root),
        virtualization=_virtualization(root, dmi),
        dmi=dmi,
        tools=_tools(root),
        lspci=lspci.map(lambda text: len(parse_lspci(text))),
        pcie_capabilities=pcie_capabilities(lspci, root, gpu_addresses),
        bios=_bios(root),
    )

"""Where a baseline was measured: bare metal, a VM with the GPU passed through, a VM, a container.

`detect_environment()` reads the host through `host_tuning.facts.gather_facts` (CPUID hypervisor
flag, DMI, systemd-detect-virt, container marker files, cgroups, kernel command line, NVML) and
adds what facts does not judge: the GPU's NVML virtualization mode, the hypervisor vendor, and the
sandboxes that hide inside a container or a VM (gVisor, Kata Containers).

The kind is decided in this order: any GPU in NVML passthrough mode -> "vm-passthrough"; any
other sign of a VM (hypervisor flag, VM vendor in DMI, vGPU mode, a Kata guest) -> "vm"; container
markers or gVisor -> "container"; no hypervisor flag -> "bare-metal"; else "unknown". A container
inside a VM is a VM (what it does to timings comes from the VM); `container` says it too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from host_tuning.fact import REAL_ROOT, Fact, read_text, run_tool
from host_tuning.facts import VM_VENDORS, HostFacts, gather_facts
from host_tuning.nvml_base import VIRTUALIZATION_MODES, NvmlBackend

KINDS = ("bare-metal", "vm-passthrough", "vm", "container", "unknown")
PASSTHROUGH = 1
VGPU = 2


@dataclass(frozen=True)
class Environment:
    kind: str  # one of KINDS
    evidence: list[str]
    hypervisor_vendor: str | None
    container: bool = False
    sandbox: str | None = None  # "gvisor" or "kata"
    gpu_virtualization_mode: str | None = None  # NVML name: none, passthrough, vgpu, ...

    @property
    def label(self) -> str:
        """Words for a sentence: "bare metal", "VM (GPU passthrough)", ..."""
        return LABELS.get(self.kind, self.kind)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "environment") -> Environment:
        """Read back `to_dict()`; a ValueError names the offending field."""
        if not isinstance(doc, dict):
            raise ValueError(f"{where} must be an object")
        kind = doc.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}.kind must be one of {', '.join(KINDS)}, got {kind!r}")
        evidence = doc.get("evidence", [])
        if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
            raise ValueError(f"{where}.evidence must be a list of strings")
        vendor = doc.get("hypervisor_vendor")
        if vendor is not None and not isinstance(vendor, str):
            raise ValueError(f"{where}.hypervisor_vendor must be a string or null")
        return cls(
            kind=kind,
            evidence=list(evidence),
            hypervisor_vendor=vendor,
            container=bool(doc.get("container", False)),
            sandbox=doc.get("sandbox"),
            gpu_virtualization_mode=doc.get("gpu_virtualization_mode"),
        )


LABELS = {
    "bare-metal": "bare metal",
    "vm-passthrough": "VM (GPU passthrough)",
    "vm": "VM",
    "container": "container",
    "unknown": "unknown host",
}


@dataclass
class _Signs:
    vm: list[str] = field(default_factory=list)
    container: list[str] = field(default_factory=list)
    bare: list[str] = field(default_factory=list)
    modes: list[int] = field(default_factory=list)
    sandbox: str | None = None


def _nvml_modes(facts: HostFacts, signs: _Signs) -> None:
    for gpu in facts.gpus:
        fact = gpu.get("virtualization_mode")
        if not fact.known or not isinstance(fact.value, int):
            continue
        signs.modes.append(fact.value)
        name = VIRTUALIZATION_MODES.get(fact.value, f"mode {fact.value}")
        line = f"NVML virtualization mode {name} (GPU {gpu.index})"
        if fact.value in (PASSTHROUGH, VGPU):
            signs.vm.append(line)
        else:
            signs.bare.append(line)


def _dmi_text(facts: HostFacts) -> str:
    return " ".join(str(f.value) for f in (facts.dmi.sys_vendor, facts.dmi.product_name) if f.known)


def _is_vm_vendor(text: str) -> bool:
    low = text.lower()
    return any(vendor in low for vendor in VM_VENDORS) and "metal" not in low


def _cpu_and_dmi(facts: HostFacts, signs: _Signs) -> None:
    virt = facts.virtualization
    flag = virt.cpu_hypervisor_flag
    if flag.value is True:
        signs.vm.append("CPUID hypervisor flag in /proc/cpuinfo")
    elif flag.value is False:
        signs.bare.append("no CPUID hypervisor flag in /proc/cpuinfo")
    dmi = _dmi_text(facts)
    if dmi:
        line = (
            f"DMI sys_vendor {facts.dmi.sys_vendor.value!r}, "
            f"product_name {facts.dmi.product_name.value!r}"
        )
        (signs.vm if _is_vm_vendor(dmi) else signs.bare).append(line)
    tool = virt.systemd_detect_virt_vm
    if tool.known and tool.value:
        line = f"systemd-detect-virt --vm: {tool.value}"
        (signs.bare if tool.value == "none" else signs.vm).append(line)


def _containers(facts: HostFacts, root: Path, signs: _Signs) -> None:
    virt = facts.virtualization
    markers = (
        (virt.dockerenv, "/.dockerenv present"),
        (virt.containerenv, "/run/.containerenv present"),
        (virt.cgroup_container_marker, "container cgroup path in /proc/1/cgroup"),
    )
    signs.container += [line for fact, line in markers if fact.value is True]
    tool = virt.systemd_detect_virt_container
    if tool.known and tool.value and tool.value != "none":
        signs.container.append(f"systemd-detect-virt --container: {tool.value}")

    cmdline = str(facts.kernel.cmdline.value or "")
    release = str(facts.kernel.release.value or "")
    if "gvisor" in cmdline.lower() or release.lower().endswith("gvisor"):
        signs.sandbox = "gvisor"
        signs.container.append("gVisor kernel (/proc/cmdline or kernel release)")
    mounts = read_text(root, "/proc/self/mounts")
    if "kata" in cmdline.lower() or "kataShared" in str(mounts.value or ""):
        signs.sandbox = "kata"
        signs.vm.append("Kata Containers guest (kernel command line or kataShared mount)")
        signs.container.append("Kata Containers sandbox")


def _cpuid_vendor(root: Path) -> Fact:
    """The CPUID hypervisor vendor lscpu prints; unknown off the real root or without lscpu."""

    def vendor(text: str) -> str:
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == "Hypervisor vendor":
                return value.strip()
        raise ValueError("no 'Hypervisor vendor' line")

    return run_tool(root, ["lscpu"]).map(vendor)


def _hypervisor_vendor(facts: HostFacts, root: Path, signs: _Signs) -> str | None:
    cpuid = _cpuid_vendor(root)
    if cpuid.known:
        signs.vm.append(f"CPUID hypervisor vendor {cpuid.value} (lscpu)")
        return cpuid.value
    dmi = facts.dmi.sys_vendor
    if dmi.known and _is_vm_vendor(_dmi_text(facts)):
        return str(dmi.value)
    xen = read_text(root, "/sys/hypervisor/type")
    if xen.known and xen.value:
        signs.vm.append(f"/sys/hypervisor/type: {xen.value}")
        return str(xen.value)
    tool = facts.virtualization.systemd_detect_virt_vm
    if tool.known and tool.value and tool.value != "none":
        return str(tool.value)
    return None


def _kind(signs: _Signs) -> str:
    if PASSTHROUGH in signs.modes:
        return "vm-passthrough"
    if signs.vm:
        return "vm"
    if signs.container:
        return "container"
    if signs.bare:
        return "bare-metal"
    return "unknown"


def detect_environment(root: Path = REAL_ROOT, nvml: NvmlBackend | None = None) -> Environment:
    """Classify the host under `root` (a fake tree in tests). With `nvml` None the real NVML is
    probed when `root` is "/". Never raises for what it cannot read: that is left out of the
    evidence, and with no evidence at all the kind is "unknown"."""
    root = Path(root)
    facts = gather_facts(nvml=nvml, root=root)
    signs = _Signs()
    _nvml_modes(facts, signs)
    _cpu_and_dmi(facts, signs)
    _containers(facts, root, signs)
    vendor = _hypervisor_vendor(facts, root, signs)
    kind = _kind(signs)
    if kind == "bare-metal":
        evidence = signs.bare
    elif kind == "container":
        evidence = signs.container + signs.bare
    else:
        evidence = signs.vm + signs.container
    mode = signs.modes[0] if signs.modes else None
    return Environment(
        kind=kind,
        evidence=evidence,
        hypervisor_vendor=vendor if kind in ("vm", "vm-passthrough") else None,
        container=bool(signs.container),
        sandbox=signs.sandbox,
        gpu_virtualization_mode=None if mode is None else VIRTUALIZATION_MODES.get(mode),
    )

"""Checks: a table of rules over host facts, each with its recommended value and fix.

`run_checks(facts)` gives one `CheckResult` per rule and subject (the host, or
each GPU). Status is pass, warn, fail or unknown; unknown always says which fact
could not be read and why. PCIe links downshift at idle on purpose, so a slow
link of an idle GPU only warns; `check_pcie_under_load` is the strict version
for callers that have a load running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from host_tuning.fact import Fact
from host_tuning.facts import GpuFacts, HostFacts
from host_tuning.families import OTHER, gpu_family
from host_tuning.lspci import PcieCapabilityFacts
from host_tuning.nvml_base import (
    COMPUTE_MODES,
    POWER_REASONS,
    THERMAL_REASONS,
    VIRTUALIZATION_MODES,
    NvmlBackend,
    decode_clock_event_reasons,
)
from host_tuning.pci import PciDeviceFacts
from host_tuning.topology import pair_checks

STATUSES = ("pass", "warn", "fail", "unknown")
SEVERITIES = ("low", "medium", "high")
NEEDS = ("none", "reboot", "bios")
NO_DRIVER = "no NVIDIA driver found"


@dataclass(frozen=True)
class CheckResult:
    id: str
    subject: str  # "host", "gpu0 (0000:00:06.0)" or "pci 0000:01:00.0"
    status: str
    actual: Any
    recommended: str
    severity: str
    fix: str
    needs: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    status: str
    actual: Any
    message: str


@dataclass(frozen=True)
class Rule:
    """One check. `recommended` maps a GPU family (or "*") to the recommended value."""

    id: str
    title: str
    scope: str  # "host", "gpu" (NVML GPU) or "pci_gpu" (sysfs GPU, no NVML)
    reads: tuple[str, ...]
    recommended: dict[str, str]
    severity: str
    fix: str
    needs: str
    evaluate: Callable[..., Verdict]

    def recommended_for(self, family: str = OTHER) -> str:
        return self.recommended.get(family, self.recommended["*"])


def _unknown(*named: tuple[str, Fact]) -> Verdict | None:
    """An unknown verdict naming the first unreadable fact, or None when all are known."""
    for name, fact in named:
        if not fact.known:
            return Verdict("unknown", None, f"cannot read {name}: {fact.reason}")
    return None


def _is_idle(reasons: Fact) -> bool | None:
    if not reasons.known or not isinstance(reasons.value, int):
        return None
    return "gpu_idle" in decode_clock_event_reasons(reasons.value)


def pcie_gen_verdict(current: Fact, maximum: Fact, idle: bool | None) -> Verdict:
    """Link generation against its max; `idle` None means the load state is unknown."""
    missing = _unknown(("current link generation", current), ("max link generation", maximum))
    if missing:
        return missing
    actual = f"Gen{current.value} (max Gen{maximum.value})"
    if current.value >= maximum.value:
        return Verdict("pass", actual, f"link at its maximum, Gen{maximum.value}")
    if idle is False:
        return Verdict(
            "fail",
            actual,
            f"link trained to Gen{current.value} under load, below Gen{maximum.value}: "
            "check slot, riser, BIOS link speed setting",
        )
    state = "idle" if idle else "load state unknown"
    return Verdict(
        "warn",
        actual,
        f"link at Gen{current.value} ({state}); idle links downshift to save power: "
        "re-check under load",
    )


def pcie_width_verdict(current: Fact, maximum: Fact, idle: bool | None) -> Verdict:
    missing = _unknown(("current link width", current), ("max link width", maximum))
    if missing:
        return missing
    actual = f"x{current.value} (max x{maximum.value})"
    if current.value >= maximum.value:
        return Verdict("pass", actual, f"link at its full width, x{maximum.value}")
    hint = " (re-check under load if this part narrows its link at idle)" if idle else ""
    return Verdict(
        "fail",
        actual,
        f"link runs x{current.value} of x{maximum.value}: a bad seat, riser, or "
        f"bifurcation setting{hint}",
    )


# --- GPU rules (NVML) ---------------------------------------------------------


def _gpu_pcie_gen(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    return pcie_gen_verdict(
        gpu.get("pcie_link_gen_current"),
        gpu.get("pcie_link_gen_max"),
        _is_idle(gpu.get("clock_event_reasons_current")),
    )


def _gpu_pcie_width(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    return pcie_width_verdict(
        gpu.get("pcie_link_width_current"),
        gpu.get("pcie_link_width_max"),
        _is_idle(gpu.get("clock_event_reasons_current")),
    )


def _gpu_pcie_slot(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    system, device = gpu.get("pcie_link_gen_max"), gpu.get("pcie_link_gen_gpu_max")
    missing = _unknown(("max link generation", system), ("GPU max link generation", device))
    if missing:
        return missing
    actual = f"slot Gen{system.value}, GPU Gen{device.value}"
    if system.value >= device.value:
        return Verdict("pass", actual, f"slot allows the GPU's Gen{device.value}")
    return Verdict(
        "warn",
        actual,
        f"the slot or host caps the link at Gen{system.value}; the GPU supports "
        f"Gen{device.value}: check the BIOS PCIe speed setting or move the GPU",
    )


def _gpu_pcie_replays(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    replays = gpu.get("pcie_replay_counter")
    missing = _unknown(("PCIe replay counter", replays))
    if missing:
        return missing
    if replays.value == 0:
        return Verdict("pass", 0, "no PCIe replays since reset")
    return Verdict(
        "warn", replays.value, f"{replays.value} PCIe replays: link errors (signal integrity)"
    )


def _gpu_persistence(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    mode = gpu.get("persistence_mode")
    missing = _unknown(("persistence mode", mode))
    if missing:
        return missing
    if mode.value == 1:
        return Verdict("pass", "enabled", "persistence mode on")
    return Verdict(
        "warn",
        "disabled",
        "persistence off: the driver tears down between processes, adding start-up latency",
    )


def _pair(fact: Fact) -> tuple[int, int] | None:
    value = fact.value
    if isinstance(value, list | tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


def _not_supported(fact: Fact) -> bool:
    return not fact.known and "Not Supported" in (fact.reason or "")


def _on_off(value: int) -> str:
    return "enabled" if value else "disabled"


def _gpu_ecc(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    ecc = gpu.get("ecc_mode")
    if _not_supported(ecc):
        return Verdict("pass", "not supported", "this GPU has no ECC mode")
    missing = _unknown(("ECC mode", ecc))
    if missing:
        return missing
    pair = _pair(ecc)
    if pair is None:
        return Verdict("unknown", ecc.value, f"ECC mode not a [current, pending] pair: {ecc.value}")
    current, pending = pair
    actual = f"{_on_off(current)} (pending {_on_off(pending)})"
    if current != pending:
        return Verdict(
            "warn", actual, f"ECC changes to {_on_off(pending)} at the next GPU reset or reboot"
        )
    wanted = RECOMMENDED_ECC.get(gpu.family)
    if wanted is not None and current != wanted:
        return Verdict(
            "warn",
            actual,
            f"ECC {_on_off(current)}; {gpu.family} parts are normally run with ECC "
            f"{_on_off(wanted)}: measurements will not match other hosts",
        )
    return Verdict("pass", actual, f"ECC {_on_off(current)}, nothing pending")


RECOMMENDED_ECC = {"H100/H200": 1, "B200": 1, "A100": 1, "L40S": 1, "RTX 4090/5090": 0}


def _gpu_mig(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    mig = gpu.get("mig_mode")
    if _not_supported(mig):
        return Verdict("pass", "not supported", "this GPU has no MIG mode")
    missing = _unknown(("MIG mode", mig))
    if missing:
        return missing
    pair = _pair(mig)
    if pair is None:
        return Verdict("unknown", mig.value, f"MIG mode not a [current, pending] pair: {mig.value}")
    current, pending = pair
    actual = f"{_on_off(current)} (pending {_on_off(pending)})"
    if current:
        return Verdict("warn", actual, "MIG on: work runs on a slice, not the whole GPU")
    if pending:
        return Verdict("warn", actual, "MIG turns on at the next GPU reset")
    return Verdict("pass", actual, "MIG off")


def _watts(fact: Fact) -> float | None:
    return fact.value / 1000.0 if fact.known and isinstance(fact.value, int | float) else None


def _gpu_power_limit(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    limit, default = gpu.get("power_limit_mw"), gpu.get("power_limit_default_mw")
    missing = _unknown(("power limit", limit), ("default power limit", default))
    if missing:
        return missing
    lim_w, def_w = _watts(limit), _watts(default)
    enforced_w = _watts(gpu.get("power_limit_enforced_mw"))
    constraints = _pair(gpu.get("power_limit_constraints_mw"))
    max_w = constraints[1] / 1000.0 if constraints else None
    actual = f"{lim_w:g} W (default {def_w:g} W" + (f", max {max_w:g} W)" if max_w else ")")
    if lim_w < def_w:
        return Verdict(
            "warn", actual, f"power limit lowered to {lim_w:g} W, below the default {def_w:g} W"
        )
    if enforced_w is not None and enforced_w < lim_w:
        return Verdict(
            "warn",
            actual,
            f"another source (BMC, cluster manager) enforces {enforced_w:g} W, "
            f"below the set {lim_w:g} W",
        )
    if max_w is not None and lim_w < max_w:
        return Verdict(
            "pass", actual, f"at default; the part allows up to {max_w:g} W (profile 'max')"
        )
    return Verdict("pass", actual, "power limit at the part's maximum")


def _gpu_clock_events(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    reasons = gpu.get("clock_event_reasons_current")
    missing = _unknown(("clock event reasons", reasons))
    if missing:
        return missing
    names = decode_clock_event_reasons(int(reasons.value))
    actual = ", ".join(names) or "none"
    thermal = sorted(set(names) & THERMAL_REASONS)
    power = sorted(set(names) & POWER_REASONS)
    if thermal:
        return Verdict("fail", actual, f"clocks held down by heat: {', '.join(thermal)}")
    if power:
        return Verdict("warn", actual, f"clocks held down by power: {', '.join(power)}")
    if "applications_clocks_setting" in names:
        return Verdict("pass", actual, "clocks set by a user (locked or applications clocks)")
    return Verdict("pass", actual, "no thermal or power slowdown")


def _gpu_app_clocks(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    app, default = (
        gpu.get("clock_graphics_applications_mhz"),
        gpu.get("clock_graphics_default_applications_mhz"),
    )
    if _not_supported(app) or _not_supported(default):
        return Verdict("pass", "not supported", "this GPU has no applications clocks")
    missing = _unknown(("applications clock", app), ("default applications clock", default))
    if missing:
        return missing
    actual = f"{app.value} MHz (default {default.value} MHz)"
    if app.value < default.value:
        return Verdict("warn", actual, "graphics applications clock lowered below its default")
    return Verdict("pass", actual, "graphics applications clock at or above default")


def _gpu_compute_mode(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    mode = gpu.get("compute_mode")
    missing = _unknown(("compute mode", mode))
    if missing:
        return missing
    name = COMPUTE_MODES.get(mode.value, f"mode {mode.value}")
    if name == "prohibited":
        return Verdict("fail", name, "compute prohibited: no CUDA context can be created")
    if name == "exclusive_thread":
        return Verdict("warn", name, "exclusive-thread mode (deprecated) may block the benchmark")
    return Verdict("pass", name, f"compute mode {name}")


def _gpu_processes(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    procs = gpu.get("compute_processes")
    missing = _unknown(("compute processes", procs))
    if missing:
        return missing
    if not procs.value:
        return Verdict("pass", 0, "no other compute process on the GPU")
    pids = ", ".join(str(p) for p in procs.value)
    return Verdict("warn", len(procs.value), f"other processes use the GPU (pids {pids})")


# --- PCIe capabilities (lspci, root) --------------------------------------------


def _capabilities(gpu: GpuFacts, facts: HostFacts) -> Verdict | PcieCapabilityFacts:
    caps = facts.pcie_capabilities_for(gpu.pci_address)
    if caps is not None:
        return caps
    why = facts.lspci.reason or "this GPU is not on the PCI bus as sysfs lists it"
    return Verdict("unknown", None, f"no lspci facts for this GPU: {why}")


def _gpu_acs(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    if len(facts.gpus) < 2:
        return Verdict("pass", "one GPU", "one GPU: ACS redirect only slows GPU peer-to-peer")
    caps = _capabilities(gpu, facts)
    if isinstance(caps, Verdict):
        return caps
    missing = _unknown(("ACS control of the bridges above the GPU", caps.acs_redirect))
    if missing:
        return missing
    if not caps.acs_redirect.value:
        bridges = len(caps.upstream.value or [])
        return Verdict("pass", "no redirect", f"no ACS redirect on the {bridges} bridge(s) above")
    actual = "; ".join(f"{b}: {', '.join(f)}" for b, f in caps.acs_redirect.value.items())
    return Verdict(
        "warn",
        actual,
        "ACS redirect on a bridge above the GPU: peer-to-peer traffic between GPUs detours "
        "through the root complex (slower NCCL/P2P)",
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def _gpu_resizable_bar(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    bar1, memory = gpu.get("bar1_total_bytes"), gpu.get("memory_total_bytes")
    caps = facts.pcie_capabilities_for(gpu.pci_address)
    rebar = caps.resizable_bar if caps is not None else None
    if bar1.known and memory.known and bar1.value >= memory.value:
        return Verdict(
            "pass", _gib(bar1.value), f"BAR1 maps the whole framebuffer ({_gib(memory.value)})"
        )
    if rebar is not None and rebar.known and rebar.value:
        current, largest = rebar.value["current_bytes"], rebar.value["max_bytes"]
        actual = f"BAR{rebar.value['bar']} {_gib(current)} (max {_gib(largest)})"
        if current >= largest:
            return Verdict("pass", actual, "the resizable BAR is at its largest size")
        return Verdict(
            "warn", actual, "Resizable BAR not at its largest size: enable it in the BIOS"
        )
    missing = _unknown(("BAR1 size", bar1), ("framebuffer size", memory))
    if missing:
        return missing
    return Verdict(
        "warn",
        f"{_gib(bar1.value)} of {_gib(memory.value)}",
        "BAR1 maps only part of the framebuffer: Resizable BAR or Above 4G Decoding is off "
        "(affects peer-to-peer and RDMA mappings)",
    )


def _gpu_max_read_request(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    caps = _capabilities(gpu, facts)
    if isinstance(caps, Verdict):
        return caps
    missing = _unknown(("PCIe MaxReadReq", caps.max_read_request))
    if missing:
        return missing
    size = caps.max_read_request.value
    if size >= 512:
        return Verdict("pass", f"{size} bytes", f"MaxReadReq {size} bytes")
    return Verdict(
        "warn",
        f"{size} bytes",
        f"MaxReadReq {size} bytes: the GPU reads host memory in small requests "
        "(slower host-to-device copies)",
    )


def _gpu_max_payload(gpu: GpuFacts, facts: HostFacts) -> Verdict:
    caps = _capabilities(gpu, facts)
    if isinstance(caps, Verdict):
        return caps
    used, able = caps.max_payload, caps.max_payload_supported
    missing = _unknown(("PCIe MaxPayload", used), ("PCIe MaxPayload supported", able))
    if missing:
        return missing
    actual = f"{used.value} bytes (GPU supports {able.value})"
    if used.value >= min(256, able.value):
        return Verdict("pass", actual, f"MaxPayload {used.value} bytes")
    return Verdict(
        "warn", actual, f"MaxPayload {used.value} bytes: a bridge or the BIOS caps the payload"
    )


# --- sysfs GPUs (no NVML) -------------------------------------------------------


def _pci_pcie_gen(dev: PciDeviceFacts, facts: HostFacts) -> Verdict:
    return pcie_gen_verdict(dev.current_link_gen, dev.max_link_gen, None)


def _pci_pcie_width(dev: PciDeviceFacts, facts: HostFacts) -> Verdict:
    return pcie_width_verdict(dev.current_link_width, dev.max_link_width, None)


# --- host rules -------------------------------------------------------------------


def _driver(facts: HostFacts) -> Verdict:
    nvml = facts.driver.nvml
    on_bus = len(facts.pci_gpus)
    if not nvml.known:
        bus = (
            f"; {on_bus} NVIDIA GPU(s) on the PCI bus without a working driver"
            if on_bus
            else "; no NVIDIA GPU on the PCI bus"
            if facts.pci_bus.known
            else f"; PCI bus unreadable: {facts.pci_bus.reason}"
        )
        status = "fail" if on_bus else "unknown"
        return Verdict(status, None, f"{NO_DRIVER}: {nvml.reason}{bus}")
    if not facts.gpus:
        status = "fail" if on_bus else "unknown"
        return Verdict(status, 0, f"NVML loaded but sees no GPU ({on_bus} on the PCI bus)")
    version = facts.driver.driver_version.value or "unknown version"
    return Verdict("pass", version, f"driver {version}, {len(facts.gpus)} GPU(s)")


def _governor(facts: HostFacts) -> Verdict:
    gov = facts.cpu.governor
    missing = _unknown(("CPU governor", gov))
    if missing:
        return missing
    if gov.value == "performance":
        return Verdict("pass", gov.value, "all CPUs on the performance governor")
    return Verdict(
        "warn", gov.value, f"governor {gov.value}: CPU-side launch latency varies with load"
    )


def _boost(facts: HostFacts) -> Verdict:
    boost = facts.cpu.boost
    missing = _unknown(("CPU boost", boost))
    if missing:
        return missing
    if boost.value:
        return Verdict("pass", "enabled", "CPU boost allowed")
    return Verdict("warn", "disabled", "CPU boost off: slower kernel launches and host code")


def _thp(facts: HostFacts) -> Verdict:
    thp = facts.memory.thp_enabled
    missing = _unknown(("transparent hugepages", thp))
    if missing:
        return missing
    if thp.value in ("madvise", "always"):
        return Verdict("pass", thp.value, f"transparent hugepages {thp.value}")
    return Verdict(
        "warn", thp.value, "transparent hugepages off: more TLB misses on large host buffers"
    )


def _numa_balancing(facts: HostFacts) -> Verdict:
    balancing, nodes = facts.memory.numa_balancing, facts.memory.numa_nodes
    missing = _unknown(("NUMA balancing", balancing))
    if missing:
        return missing
    actual = "on" if balancing.value else "off"
    if not balancing.value:
        return Verdict("pass", actual, "automatic NUMA balancing off")
    if nodes.known and nodes.value <= 1:
        return Verdict("pass", actual, "NUMA balancing on, but one NUMA node: no effect")
    return Verdict(
        "warn", actual, "automatic NUMA balancing migrates pages under a running job (jitter)"
    )


def _iommu(facts: HostFacts) -> Verdict:
    types = {d.iommu_group_type.value for d in facts.pci_gpus if d.iommu_group_type.known}
    if types:
        actual = ", ".join(sorted(types))
        if types <= {"identity"}:
            return Verdict("pass", actual, "GPU IOMMU groups in passthrough (identity) mode")
        if types & {"DMA", "DMA-FQ"}:
            return Verdict(
                "warn", actual, "GPU DMA goes through IOMMU translation: slower host<->GPU copies"
            )
        return Verdict("pass", actual, f"GPU IOMMU group type {actual}")
    groups = facts.kernel.iommu_groups
    if groups.known and groups.value == 0:
        return Verdict("pass", "no IOMMU groups", "IOMMU off or not exposed: no translation")
    params = facts.kernel.iommu_params
    missing = _unknown(("kernel command line", params))
    if missing:
        return missing
    p = params.value
    actual = " ".join(f"{k}={v}" for k, v in p.items()) or "no iommu parameters"
    if p.get("iommu") == "pt" or p.get("iommu.passthrough") == "1":
        return Verdict("pass", actual, "IOMMU passthrough requested on the command line")
    if "on" in (p.get("intel_iommu"), p.get("amd_iommu")) or p.get("iommu.passthrough") == "0":
        return Verdict("warn", actual, "IOMMU on in translate mode: slower host<->GPU copies")
    return Verdict(
        "unknown",
        actual,
        f"IOMMU groups present ({groups.value}) but GPU group type unreadable; "
        "no passthrough parameter on the command line",
    )


def _virtualization(facts: HostFacts) -> Verdict:
    virt = facts.virtualization
    passthrough = [
        g.index
        for g in facts.gpus
        if VIRTUALIZATION_MODES.get(g.get("virtualization_mode").value) == "passthrough"
    ]
    container = " (inside a container)" if virt.container.value is True else ""
    if passthrough:
        hv = virt.systemd_detect_virt_vm.value or virt.dmi_vendor.value
        return Verdict(
            "warn",
            f"vm, GPU passthrough{container}",
            f"GPU passed through into a VM{f' ({hv})' if hv else ''}: PCIe, interrupts and P2P go through the "
            "hypervisor; compare with bare metal before trusting host-bound numbers",
        )
    missing = _unknown(("virtualization", virt.kind))
    if missing:
        return missing
    if virt.kind.value == "vm":
        return Verdict(
            "warn",
            f"vm{container}",
            f"running in a VM ({virt.kind.source}): host-side timings include virtualization",
        )
    return Verdict("pass", f"bare-metal{container}", "bare metal" + container)


PCIE_GEN = {
    "*": "the GPU's max generation",
    "H100/H200": "Gen5",
    "B200": "Gen5 or the GPU's max",
    "A100": "Gen4",
    "L40S": "Gen4",
    "RTX 4090/5090": "Gen4 (4090), Gen5 (5090)",
}
PCIE_FIX = "reseat the GPU or riser, set the slot to its max speed in the BIOS, check bifurcation"

RULES: tuple[Rule, ...] = (
    Rule(
        "gpu.driver",
        "NVIDIA driver and NVML",
        "host",
        ("nvml", "/sys/bus/pci/devices/*/vendor"),
        {"*": "driver loaded, every GPU visible"},
        "high",
        "install the NVIDIA driver matching the kernel; load nvidia.ko",
        "reboot",
        _driver,
    ),
    Rule(
        "gpu.pcie_gen",
        "PCIe link generation",
        "gpu",
        ("nvml:pcie_link_gen_current", "nvml:pcie_link_gen_max", "nvml:clock_event_reasons"),
        PCIE_GEN,
        "high",
        PCIE_FIX,
        "bios",
        _gpu_pcie_gen,
    ),
    Rule(
        "gpu.pcie_width",
        "PCIe link width",
        "gpu",
        ("nvml:pcie_link_width_current", "nvml:pcie_link_width_max"),
        {"*": "x16"},
        "high",
        PCIE_FIX,
        "bios",
        _gpu_pcie_width,
    ),
    Rule(
        "gpu.pcie_gen",
        "PCIe link generation",
        "pci_gpu",
        ("/sys/bus/pci/devices/*/current_link_speed", "/sys/bus/pci/devices/*/max_link_speed"),
        PCIE_GEN,
        "high",
        PCIE_FIX,
        "bios",
        _pci_pcie_gen,
    ),
    Rule(
        "gpu.pcie_width",
        "PCIe link width",
        "pci_gpu",
        ("/sys/bus/pci/devices/*/current_link_width", "/sys/bus/pci/devices/*/max_link_width"),
        {"*": "x16"},
        "high",
        PCIE_FIX,
        "bios",
        _pci_pcie_width,
    ),
    Rule(
        "gpu.pcie_slot",
        "Slot allows the GPU's PCIe generation",
        "gpu",
        ("nvml:pcie_link_gen_max", "nvml:pcie_link_gen_gpu_max"),
        PCIE_GEN,
        "medium",
        "set the slot's link speed to Auto/max in the BIOS, or use a slot wired for the GPU's gen",
        "bios",
        _gpu_pcie_slot,
    ),
    Rule(
        "gpu.pcie_replays",
        "PCIe replays",
        "gpu",
        ("nvml:pcie_replay_counter",),
        {"*": "0"},
        "medium",
        "reseat the GPU and riser; lower the link speed in the BIOS if errors persist",
        "bios",
        _gpu_pcie_replays,
    ),
    Rule(
        "gpu.pcie_acs",
        "No ACS redirect above the GPUs",
        "gpu",
        ("lspci -D -vvv: ACSCtl of the bridges above the GPU",),
        {"*": "ReqRedir- CmpltRedir- on bridges above GPUs (hosts with 2+ GPUs)"},
        "medium",
        "disable ACS (or 'PCIe ACS Control') in the BIOS; or clear it at boot with "
        "setpci -s <bridge> ECAP_ACS+6.w=0000 (only where IOMMU isolation between devices "
        "is not needed)",
        "bios",
        _gpu_acs,
    ),
    Rule(
        "gpu.resizable_bar",
        "BAR1 maps the framebuffer (Resizable BAR)",
        "gpu",
        ("nvml:bar1_total_bytes", "nvml:memory_total_bytes", "lspci -D -vvv: Resizable BAR"),
        {"*": "BAR1 at least the framebuffer size"},
        "low",
        "enable Above 4G Decoding and Resizable BAR in the BIOS",
        "bios",
        _gpu_resizable_bar,
    ),
    Rule(
        "gpu.pcie_max_read_request",
        "PCIe MaxReadReq",
        "gpu",
        ("lspci -D -vvv: DevCtl MaxReadReq",),
        {"*": "512 bytes or more"},
        "low",
        "raise Max Read Request in the BIOS PCIe settings, or at boot with "
        "setpci -s <gpu> CAP_EXP+8.w (bits 12-14)",
        "bios",
        _gpu_max_read_request,
    ),
    Rule(
        "gpu.pcie_max_payload",
        "PCIe MaxPayload",
        "gpu",
        ("lspci -D -vvv: DevCap/DevCtl MaxPayload",),
        {"*": "256 bytes or the GPU's max"},
        "low",
        "set Max Payload Size to Auto/largest in the BIOS PCIe settings",
        "bios",
        _gpu_max_payload,
    ),
    Rule(
        "gpu.persistence",
        "Persistence mode",
        "gpu",
        ("nvml:persistence_mode",),
        {"*": "enabled"},
        "medium",
        "nvidia-smi -pm 1 (or run nvidia-persistenced); profile 'stable' does it",
        "none",
        _gpu_persistence,
    ),
    Rule(
        "gpu.ecc",
        "ECC mode, and no pending change",
        "gpu",
        ("nvml:ecc_mode",),
        {
            "*": "unchanged pending",
            "RTX 4090/5090": "disabled",
            **{f: "enabled" for f in ("H100/H200", "B200", "A100", "L40S")},
        },
        "medium",
        "nvidia-smi -e 1 (or 0), then reset the GPU or reboot",
        "reboot",
        _gpu_ecc,
    ),
    Rule(
        "gpu.mig",
        "MIG off",
        "gpu",
        ("nvml:mig_mode",),
        {"*": "disabled"},
        "high",
        "nvidia-smi -mig 0, then reset the GPU",
        "reboot",
        _gpu_mig,
    ),
    Rule(
        "gpu.power_limit",
        "Power limit at default or above",
        "gpu",
        ("nvml:power_limit_mw", "nvml:power_limit_default_mw", "nvml:power_limit_enforced_mw"),
        {"*": "default, or the part's max (profile 'max')"},
        "high",
        "nvidia-smi -pl <watts>; profile 'max' sets the part's maximum",
        "none",
        _gpu_power_limit,
    ),
    Rule(
        "gpu.clock_events",
        "No thermal or power slowdown",
        "gpu",
        ("nvml:clock_event_reasons_current",),
        {"*": "none, or gpu_idle"},
        "high",
        "improve cooling/airflow; raise the power limit; check the PSU and power cabling",
        "none",
        _gpu_clock_events,
    ),
    Rule(
        "gpu.applications_clocks",
        "Applications clocks not lowered",
        "gpu",
        ("nvml:clock_graphics_applications_mhz", "nvml:clock_graphics_default_applications_mhz"),
        {"*": "default applications clocks"},
        "medium",
        "nvidia-smi -rac",
        "none",
        _gpu_app_clocks,
    ),
    Rule(
        "gpu.compute_mode",
        "Compute mode allows this process",
        "gpu",
        ("nvml:compute_mode",),
        {"*": "default or exclusive_process"},
        "high",
        "nvidia-smi -c DEFAULT",
        "none",
        _gpu_compute_mode,
    ),
    Rule(
        "gpu.processes",
        "No other compute process",
        "gpu",
        ("nvml:compute_processes",),
        {"*": "none"},
        "medium",
        "stop the other GPU jobs before measuring",
        "none",
        _gpu_processes,
    ),
    Rule(
        "cpu.governor",
        "CPU frequency governor",
        "host",
        ("/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",),
        {"*": "performance"},
        "medium",
        "cpupower frequency-set -g performance "
        "(or write performance to /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor)",
        "none",
        _governor,
    ),
    Rule(
        "cpu.boost",
        "CPU boost allowed",
        "host",
        ("/sys/devices/system/cpu/cpufreq/boost", "/sys/devices/system/cpu/intel_pstate/no_turbo"),
        {"*": "enabled"},
        "low",
        "echo 1 > /sys/devices/system/cpu/cpufreq/boost "
        "(intel_pstate: echo 0 > /sys/devices/system/cpu/intel_pstate/no_turbo); "
        "or enable turbo in the BIOS",
        "none",
        _boost,
    ),
    Rule(
        "memory.thp",
        "Transparent hugepages",
        "host",
        ("/sys/kernel/mm/transparent_hugepage/enabled",),
        {"*": "madvise (or always)"},
        "low",
        "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled",
        "none",
        _thp,
    ),
    Rule(
        "memory.numa_balancing",
        "Automatic NUMA balancing off",
        "host",
        ("/proc/sys/kernel/numa_balancing", "/sys/devices/system/node"),
        {"*": "0 (off)"},
        "medium",
        "sysctl -w kernel.numa_balancing=0",
        "none",
        _numa_balancing,
    ),
    Rule(
        "iommu.passthrough",
        "IOMMU in passthrough mode for the GPUs",
        "host",
        ("/sys/kernel/iommu_groups/*/type", "/proc/cmdline"),
        {"*": "identity (iommu=pt) or IOMMU off"},
        "medium",
        "add iommu=pt to the kernel command line (keep intel_iommu=on/amd_iommu=on if VFIO "
        "needs it) and reboot",
        "reboot",
        _iommu,
    ),
    Rule(
        "host.virtualization",
        "Bare metal",
        "host",
        (
            "/proc/cpuinfo",
            "/sys/class/dmi/id/sys_vendor",
            "systemd-detect-virt",
            "/.dockerenv",
            "nvml:virtualization_mode",
        ),
        {"*": "bare-metal"},
        "medium",
        "rent bare metal for host-bound measurements; otherwise record the VM in the report",
        "none",
        _virtualization,
    ),
)


def _gpu_subject(gpu: GpuFacts) -> str:
    return f"gpu{gpu.index}" + (f" ({gpu.pci_address})" if gpu.pci_address else "")


def _result(rule: Rule, subject: str, family: str, verdict: Verdict) -> CheckResult:
    return CheckResult(
        id=rule.id,
        subject=subject,
        status=verdict.status,
        actual=verdict.actual,
        recommended=rule.recommended_for(family),
        severity=rule.severity,
        fix=rule.fix if verdict.status in ("warn", "fail") else "",
        needs=rule.needs if verdict.status in ("warn", "fail") else "none",
        message=verdict.message,
    )


def run_checks(facts: HostFacts) -> list[CheckResult]:
    """Every rule against `facts`: host rules once, GPU rules per GPU."""
    nvml_addresses = {g.pci_address for g in facts.gpus}
    sysfs_only = [d for d in facts.pci_gpus if d.address not in nvml_addresses]
    results = []
    for rule in RULES:
        if rule.scope == "host":
            results.append(_result(rule, "host", OTHER, rule.evaluate(facts)))
        elif rule.scope == "gpu":
            for gpu in facts.gpus:
                results.append(
                    _result(rule, _gpu_subject(gpu), gpu.family, rule.evaluate(gpu, facts))
                )
        else:
            for dev in sysfs_only:
                results.append(
                    _result(rule, f"pci {dev.address}", OTHER, rule.evaluate(dev, facts))
                )
    results.extend(pair_checks(facts))
    return results


def check_pcie_under_load(nvml: NvmlBackend, index: int = 0) -> list[CheckResult]:
    """PCIe generation and width of GPU `index`, read now, judged as a GPU under load.

    Call it while a load runs on that GPU: a link below its max then fails instead
    of warning.
    """

    def fact(name: str) -> Fact:
        reading = nvml.read(index, name)
        return Fact(reading.value, reading.reason, f"nvml:{name}")

    family = gpu_family(nvml.read(index, "name").value)
    subject = f"gpu{index} (under load)"
    rules = {r.id: r for r in RULES if r.scope == "gpu"}
    gen = pcie_gen_verdict(fact("pcie_link_gen_current"), fact("pcie_link_gen_max"), False)
    width = pcie_width_verdict(fact("pcie_link_width_current"), fact("pcie_link_width_max"), False)
    return [
        _result(rules["gpu.pcie_gen"], subject, family, gen),
        _result(rules["gpu.pcie_width"], subject, family, width),
    ]

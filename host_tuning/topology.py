"""How the GPUs of one host reach each other: `nvidia-smi topo -m` and NVML, per GPU pair.

Facts: `gather_topology()` runs `nvidia-smi topo -m` and asks NVML, for every pair of GPUs,
their common ancestor (same board, one PCIe switch, several switches, the host bridge, the
CPU socket interconnect), whether peer-to-peer reads and writes are supported, and how many
NVLinks join them. Nothing here writes to a GPU. `parse_topo_matrix(text)` reads the matrix
text alone (tests feed it hand-written examples).

Check: `pair_checks(facts)` flags ACS redirect on the PCIe path between two GPUs, from the
lspci facts `gather_facts` already holds (the bridges above each GPU and their ACSCtl flags):
a redirect on a bridge below the point where the two paths meet sends their peer-to-peer
traffic up to the root complex and back.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host_tuning.fact import REAL_ROOT, Fact, known, run_tool, to_plain, unknown

if TYPE_CHECKING:
    from host_tuning.checks import CheckResult
    from host_tuning.facts import HostFacts

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CELL_SPLIT = re.compile(r"\t+|\s{2,}")
SOURCE = "nvidia-smi topo -m"

# Link codes of `nvidia-smi topo -m`, nearest first, with what they cross.
LINKS: dict[str, str] = {
    "X": "self",
    "NV": "bonded NVLinks",
    "PIX": "at most one PCIe bridge (one switch)",
    "PXB": "several PCIe bridges, not the host bridge",
    "PHB": "a PCIe host bridge (the CPU's root complex)",
    "NODE": "PCIe and the interconnect between host bridges of one NUMA node",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)",
    "SOC": "PCIe and the SMP interconnect between NUMA nodes (old name of SYS)",
}
PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")

# NVML's nvmlGpuTopologyLevel_t values and their `nvidia-smi topo` codes.
NVML_LEVELS: dict[int, str] = {
    0: "internal",  # two GPUs on one board
    10: "PIX",
    20: "PXB",
    30: "PHB",
    40: "NODE",
    50: "SYS",
}
P2P_CAPS = ("read", "write", "nvlink", "atomics")
P2P_OK = 0  # NVML_P2P_STATUS_OK
MAX_NVLINKS = 18


@dataclass(frozen=True)
class TopoMatrix:
    """`nvidia-smi topo -m` as data: devices (GPUs, then NICs), the link code per pair, and the
    affinity columns per GPU."""

    devices: list[str]
    links: dict[str, dict[str, str]]
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)
    nics: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if re.fullmatch(r"GPU\d+", d)]

    def link(self, a: str, b: str) -> str:
        return self.links[a][b]


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the text of `nvidia-smi topo -m`. Raises ValueError naming what is wrong."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next(
        (i for i, line in enumerate(lines) if "GPU0" in CELL_SPLIT.split(line.strip())), None
    )
    if header_at is None:
        raise ValueError("no header row naming GPU0: not `nvidia-smi topo -m` output")
    columns = _cells(lines[header_at])
    devices = [c for c in columns if re.fullmatch(r"(GPU|NIC)\d+", c)]
    extra = columns[len(devices) :]
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    for line in lines[header_at + 1 :]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        cells = _cells(line)
        name = cells[0]
        if name not in devices:
            raise ValueError(f"row {name!r} is not a device of the header {devices}")
        values = cells[1 : 1 + len(devices)]
        if len(values) < len(devices):
            raise ValueError(f"row {name}: {len(values)} link cells for {len(devices)} devices")
        for device, code in zip(devices, values, strict=True):
            link_code(code, f"row {name}, column {device}")
        links[name] = dict(zip(devices, values, strict=True))
        if name.startswith("GPU"):
            affinity[name] = dict(zip(extra, cells[1 + len(devices) :], strict=False))
    missing = [d for d in devices if d not in links]
    if missing:
        raise ValueError(f"no row for {', '.join(missing)}")
    for a in devices:
        for b in devices:
            if a != b and links[a][b] != links[b][a]:
                raise ValueError(f"{a}-{b} is {links[a][b]} but {b}-{a} is {links[b][a]}")
    nics = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), re.M))
    return TopoMatrix(devices=devices, links=links, affinity=affinity, nics=nics)


def _cells(line: str) -> list[str]:
    """Non-empty cells of a row: tab-separated as nvidia-smi writes it, else split on runs of
    two or more spaces (a copy whose tabs became spaces)."""
    parts = line.split("\t") if "\t" in line else CELL_SPLIT.split(line)
    return [c.strip() for c in parts if c.strip()]


def link_code(code: str, where: str = "cell") -> str:
    """The family of a link code: 'NV' for NV#, else the code itself. ValueError if unknown."""
    if re.fullmatch(r"NV\d+", code):
        return "NV"
    if code in LINKS:
        return code
    raise ValueError(f"{where}: unknown link code {code!r}")


def nvlink_count(code: str) -> int:
    """NV12 -> 12; a PCIe code -> 0."""
    match = re.fullmatch(r"NV(\d+)", code)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class PairTopology:
    """How GPU `a` reaches GPU `b` (a < b)."""

    a: int
    b: int
    link: Fact  # nvidia-smi code: "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"
    nvlinks: Fact  # bonded NVLinks between the two (NVML, else nvidia-smi)
    pcie_switch: Fact  # True when the PCIe path stays below one or more switches (PIX/PXB)
    host_bridge: Fact  # True when the PCIe path crosses a host bridge (PHB, NODE, SYS)
    common_ancestor: Fact  # NVML's level: "internal", "PIX", ..., "SYS"
    p2p: Fact  # {"read": bool, "write": bool, "nvlink": bool, "atomics": bool} (NVML)


@dataclass(frozen=True)
class TopologyFacts:
    matrix: Fact  # TopoMatrix as a dict, or unknown and why
    gpu_count: int
    pairs: list[PairTopology]

    def pair(self, a: int, b: int) -> PairTopology | None:
        lo, hi = min(a, b), max(a, b)
        return next((p for p in self.pairs if (p.a, p.b) == (lo, hi)), None)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def _matrix_pair(matrix: Fact, a: int, b: int) -> Fact:
    if not matrix.known:
        return unknown(matrix.reason or "", SOURCE)
    links = matrix.value["links"]
    ga, gb = f"GPU{a}", f"GPU{b}"
    if ga not in links or gb not in links:
        return unknown(f"nvidia-smi topo shows no {ga}/{gb}", SOURCE)
    return known(links[ga][gb], SOURCE)


def _nvml_pair(nv: Any, handles: list[Any], a: int, b: int) -> dict[str, Fact]:
    """NVML's view of one pair, each part unknown with the reason where NVML refuses."""
    out: dict[str, Fact] = {}
    try:
        level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
        out["ancestor"] = known(NVML_LEVELS.get(int(level), f"level {int(level)}"), "nvml")
    except Exception as err:  # NVMLError and its subclasses, or a missing binding
        out["ancestor"] = unknown(f"nvmlDeviceGetTopologyCommonAncestor: {err}", "nvml")
    indices = {
        "read": "NVML_P2P_CAPS_INDEX_READ",
        "write": "NVML_P2P_CAPS_INDEX_WRITE",
        "nvlink": "NVML_P2P_CAPS_INDEX_NVLINK",
        "atomics": "NVML_P2P_CAPS_INDEX_ATOMICS",
    }
    try:
        caps = {
            name: int(nv.nvmlDeviceGetP2PStatus(handles[a], handles[b], getattr(nv, const)))
            == P2P_OK
            for name, const in indices.items()
        }
        out["p2p"] = known(caps, "nvml:nvmlDeviceGetP2PStatus")
    except Exception as err:
        out["p2p"] = unknown(f"nvmlDeviceGetP2PStatus: {err}", "nvml")
    out["nvlinks"] = _nvlinks_between(nv, handles[a], handles[b])
    return out


def _nvlinks_between(nv: Any, ha: Any, hb: Any) -> Fact:
    source = "nvml:nvmlDeviceGetNvLinkRemotePciInfo"
    try:
        bus_b = nv.nvmlDeviceGetPciInfo(hb).busId
    except Exception as err:
        return unknown(f"nvmlDeviceGetPciInfo: {err}", source)
    bus_b = bus_b.decode() if isinstance(bus_b, bytes) else str(bus_b)
    count = 0
    for link in range(MAX_NVLINKS):
        try:
            if not nv.nvmlDeviceGetNvLinkState(ha, link):
                continue
            remote = nv.nvmlDeviceGetNvLinkRemotePciInfo(ha, link).busId
        except Exception:  # no such link on this part, or NVLink not supported
            continue
        remote = remote.decode() if isinstance(remote, bytes) else str(remote)
        count += remote.lower() == bus_b.lower()
    return known(count, source)


def _open_nvml() -> tuple[Any, list[Any], str | None]:
    try:
        import pynvml as nv
    except ImportError as err:
        return None, [], f"pynvml not importable: {err}"
    try:
        nv.nvmlInit()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    except Exception as err:
        return None, [], f"NVML unavailable: {err}"
    return nv, handles, None


def topology_from(matrix: Fact, gpu_count: int, nvml: Any = None, handles=()) -> TopologyFacts:
    """Pairs from a parsed matrix fact (and NVML where given); `gather_topology` reads both."""
    pairs = []
    nvml_why = "NVML not read"
    for a in range(gpu_count):
        for b in range(a + 1, gpu_count):
            link = _matrix_pair(matrix, a, b)
            parts = _nvml_pair(nvml, list(handles), a, b) if nvml is not None else {}
            missing = unknown(nvml_why, "nvml")
            nvlinks = parts.get("nvlinks", missing)
            if not nvlinks.known and link.known:
                nvlinks = known(nvlink_count(link.value), SOURCE)
            ancestor = parts.get("ancestor", missing)
            family = link.value if link.known else ancestor.value
            if link.known and link_code(link.value) == "NV":
                family = ancestor.value  # NVLinked: the PCIe path is NVML's to say
            switch, bridge = _pcie_kind(family, link if link.known else ancestor)
            pairs.append(
                PairTopology(
                    a=a,
                    b=b,
                    link=link,
                    nvlinks=nvlinks,
                    pcie_switch=switch,
                    host_bridge=bridge,
                    common_ancestor=ancestor,
                    p2p=parts.get("p2p", missing),
                )
            )
    return TopologyFacts(matrix=matrix, gpu_count=gpu_count, pairs=pairs)


def _pcie_kind(code: Any, source: Fact) -> tuple[Fact, Fact]:
    if code in ("PIX", "PXB"):
        return known(True, source.source), known(False, source.source)
    if code in ("PHB", "NODE", "SYS", "SOC"):
        return known(False, source.source), known(True, source.source)
    if code == "internal":
        return known(False, source.source), known(False, source.source)
    why = "PCIe path unknown: " + (source.reason or f"link {code!r} does not say")
    return unknown(why, source.source), unknown(why, source.source)


def gather_topology(root: Path = REAL_ROOT, use_nvml: bool = True) -> TopologyFacts:
    """Read the host's GPU topology; never raises (what cannot be read is an unknown fact)."""
    text = run_tool(Path(root), ["nvidia-smi", "topo", "-m"])
    matrix = text.map(lambda t: to_plain(parse_topo_matrix(t)))
    nv, handles, why = (None, [], "not read: facts root is not /")
    if use_nvml and Path(root) == REAL_ROOT:
        nv, handles, why = _open_nvml()
    count = len(handles)
    if not handles and matrix.known:
        count = len([d for d in matrix.value["devices"] if d.startswith("GPU")])
    try:
        facts = topology_from(matrix, count, nv, handles)
    finally:
        if nv is not None:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
    if nv is None and why:
        facts = _with_nvml_reason(facts, why)
    return facts


def _with_nvml_reason(facts: TopologyFacts, why: str) -> TopologyFacts:
    def fix(fact: Fact) -> Fact:
        return unknown(why, "nvml") if not fact.known and fact.source == "nvml" else fact

    pairs = [
        PairTopology(
            p.a,
            p.b,
            p.link,
            fix(p.nvlinks),
            p.pcie_switch,
            p.host_bridge,
            fix(p.common_ancestor),
            fix(p.p2p),
        )
        for p in facts.pairs
    ]
    return TopologyFacts(facts.matrix, facts.gpu_count, pairs)


# --- the ACS check per pair -------------------------------------------------------------------

ACS_RULE_ID = "gpu.pair_acs"
ACS_FIX = (
    "disable ACS (or 'PCIe ACS Control') in the BIOS; or clear it at boot with "
    "setpci -s <bridge> ECAP_ACS+6.w=0000 on the bridges named (only where IOMMU isolation "
    "between devices is not needed)"
)


@dataclass(frozen=True)
class PairPath:
    """The PCIe path between two GPUs: the bridges below the point where their paths meet."""

    a: str
    b: str
    bridges: list[str]  # bridges only one of the two GPUs sits under
    shared: list[str]  # bridges above both (the common part)


def pcie_path(upstream_a: list[str], upstream_b: list[str], a: str, b: str) -> PairPath:
    """Bridges on the path between GPUs at addresses `a` and `b`, given the bridges above each
    (nearest the root first, as `lspci.upstream_bridges` gives them)."""
    shared = []
    for x, y in zip(upstream_a, upstream_b, strict=False):
        if x != y:
            break
        shared.append(x)
    rest = upstream_a[len(shared) :] + upstream_b[len(shared) :]
    return PairPath(a=a, b=b, bridges=rest, shared=shared)


def _pair_verdict(facts: HostFacts, ga: Any, gb: Any) -> tuple[str, Any, str]:
    caps_a = facts.pcie_capabilities_for(ga.pci_address)
    caps_b = facts.pcie_capabilities_for(gb.pci_address)
    if caps_a is None or caps_b is None:
        why = facts.lspci.reason or "a GPU is not on the PCI bus as sysfs lists it"
        return "unknown", None, f"no lspci facts for this pair: {why}"
    for caps in (caps_a, caps_b):
        if not caps.upstream.known:
            why = caps.upstream.reason
            return "unknown", None, f"cannot read the bridges above {caps.address}: {why}"
        if not caps.acs_redirect.known:
            return "unknown", None, f"cannot read ACS control: {caps.acs_redirect.reason}"
    path = pcie_path(caps_a.upstream.value, caps_b.upstream.value, caps_a.address, caps_b.address)
    redirects = {**caps_a.acs_redirect.value, **caps_b.acs_redirect.value}
    on_path = {bridge: redirects[bridge] for bridge in path.bridges if bridge in redirects}
    if not on_path:
        return (
            "pass",
            "no redirect",
            f"no ACS redirect on the {len(path.bridges)} bridge(s) between",
        )
    actual = "; ".join(f"{b}: {', '.join(f)}" for b, f in on_path.items())
    message = (
        "ACS redirect on the PCIe path between the two GPUs: their peer-to-peer traffic is sent "
        "up to the root complex and back (slower P2P copies and NCCL)"
    )
    return "warn", actual, message


def pair_checks(facts: HostFacts, topology: TopologyFacts | None = None) -> list[CheckResult]:
    """One `gpu.pair_acs` result per pair of NVML GPUs (none with fewer than two GPUs). A pair
    joined by NVLink passes: its peer traffic does not cross PCIe."""
    from host_tuning.checks import CheckResult

    gpus = sorted(facts.gpus, key=lambda g: g.index)
    results = []
    for i, ga in enumerate(gpus):
        for gb in gpus[i + 1 :]:
            pair = topology.pair(ga.index, gb.index) if topology is not None else None
            if pair is not None and pair.nvlinks.known and pair.nvlinks.value:
                status, actual = "pass", f"NVLink x{pair.nvlinks.value}"
                message = "joined by NVLink: peer traffic does not cross PCIe"
            else:
                status, actual, message = _pair_verdict(facts, ga, gb)
            flagged = status in ("warn", "fail")
            results.append(
                CheckResult(
                    id=ACS_RULE_ID,
                    subject=f"gpu{ga.index}-gpu{gb.index}",
                    status=status,
                    actual=actual,
                    recommended="no ACS redirect on bridges between GPUs",
                    severity="medium",
                    fix=ACS_FIX if flagged else "",
                    needs="bios" if flagged else "none",
                    message=message,
                )
            )
    return results

"""PCIe capabilities from `lspci -D -vvv` (root only): payload sizes, relaxed ordering,
resizable BAR of each NVIDIA GPU, and ACS control of the bridges above it.

`parse_lspci(text)` reads lspci's text; `pcie_capabilities(lspci, root, addresses)`
turns it into facts per GPU, finding the bridges above a GPU from its sysfs path.
Without root lspci prints "<access denied>" for capabilities: those facts are
unknown with that reason, never guessed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from host_tuning.fact import REAL_ROOT, Fact, known, run_tool, under, unknown

ADDRESS = re.compile(r"^((?:[0-9a-f]{4,}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\s+(.*)$", re.I)
BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.I)
REGISTER = re.compile(r"^\t\t(\w+):\s*(.*)$")
CAPABILITY = re.compile(r"^\tCapabilities: (.*)$")
BAR = re.compile(r"BAR (\d+): current size: (\w+), supported: (.*)$")
FLAG = re.compile(r"\b(\w+)([+-])(?=\s|$)")
SIZE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
ACS_REDIRECT_FLAGS = ("ReqRedir", "CmpltRedir", "EgressCtrl")
SOURCE = "lspci -D -vvv"


def size_bytes(text: str) -> int:
    """'256MB' -> 268435456."""
    match = re.fullmatch(r"(\d+)\s*([KMGT]?B)", text.strip(), re.I)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    return int(match.group(1)) * SIZE_UNITS[match.group(2).upper()]


@dataclass(frozen=True)
class ResizableBar:
    index: int
    current_bytes: int
    supported_bytes: list[int]

    @property
    def at_max(self) -> bool:
        return self.current_bytes >= max(self.supported_bytes, default=0)


@dataclass(frozen=True)
class LspciDevice:
    """One PCI function as lspci -vvv shows it; None where lspci did not say."""

    address: str  # with domain, "0000:41:00.0"
    description: str
    access_denied: bool = False  # capabilities hidden: not root
    max_payload_supported: int | None = None  # DevCap, bytes
    max_payload: int | None = None  # DevCtl, bytes
    max_read_request: int | None = None  # DevCtl, bytes
    relaxed_ordering: bool | None = None  # DevCtl RlxdOrd
    acs_control: dict[str, bool] | None = None  # ACSCtl flags; None without ACS
    resizable_bars: list[ResizableBar] = field(default_factory=list)
    has_resizable_bar: bool = False
    driver: str | None = None


def _registers(lines: list[str]) -> dict[str, str]:
    """Register name -> its text, continuation lines joined ("DevCtl" -> "... RlxdOrd+ ...")."""
    registers: dict[str, str] = {}
    current = None
    for line in lines:
        match = REGISTER.match(line)
        if match:
            current = match.group(1)
            registers.setdefault(current, match.group(2))
        elif current and line.startswith("\t\t\t"):
            registers[current] += " " + line.strip()
        else:
            current = None
    return registers


def _flags(text: str) -> dict[str, bool]:
    return {name: sign == "+" for name, sign in FLAG.findall(text)}


def _bytes(pattern: str, text: str | None) -> int | None:
    match = re.search(pattern + r" (\d+) bytes", text or "")
    return int(match.group(1)) if match else None


def _device(address: str, description: str, lines: list[str]) -> LspciDevice:
    if address.count(":") == 1:
        address = f"0000:{address}"
    registers = _registers(lines)
    bars, has_rebar, in_rebar = [], False, False
    for line in lines:
        capability = CAPABILITY.match(line)
        if capability:
            in_rebar = "Resizable BAR" in capability.group(1)
            has_rebar = has_rebar or in_rebar
            continue
        bar = BAR.search(line) if in_rebar else None
        if bar:
            supported = [size_bytes(s) for s in bar.group(3).split()]
            bars.append(ResizableBar(int(bar.group(1)), size_bytes(bar.group(2)), supported))
    dev_ctl = registers.get("DevCtl")
    driver = next(
        (ln.split(":", 1)[1].strip() for ln in lines if "Kernel driver in use:" in ln), None
    )
    return LspciDevice(
        address=address.lower(),
        description=description,
        access_denied=any("<access denied>" in line for line in lines),
        max_payload_supported=_bytes("MaxPayload", registers.get("DevCap")),
        max_payload=_bytes("MaxPayload", dev_ctl),
        max_read_request=_bytes("MaxReadReq", dev_ctl),
        relaxed_ordering=_flags(dev_ctl).get("RlxdOrd") if dev_ctl else None,
        acs_control=_flags(registers["ACSCtl"]) if "ACSCtl" in registers else None,
        resizable_bars=bars,
        has_resizable_bar=has_rebar,
        driver=driver,
    )


def parse_lspci(text: str) -> dict[str, LspciDevice]:
    """Devices of `lspci -vvv` text (with or without -D), keyed by domain-qualified address."""
    devices: dict[str, LspciDevice] = {}
    header: tuple[str, str] | None = None
    body: list[str] = []
    for line in [*text.splitlines(), ""]:
        match = ADDRESS.match(line)
        if match or not line.strip():
            if header is not None:
                device = _device(*header, body)
                devices[device.address] = device
            header, body = (match.group(1), match.group(2)) if match else None, []
        elif header is not None:
            body.append(line)
    return devices


def read_lspci(root: Path) -> Fact:
    """lspci -D -vvv text; unknown without root (capabilities would read "<access denied>")."""
    if root == REAL_ROOT and os.geteuid() != 0:
        return unknown("needs root: lspci shows PCIe capabilities to root only", SOURCE)
    return run_tool(root, ["lspci", "-D", "-vvv"])


def upstream_bridges(root: Path, address: str) -> Fact:
    """Addresses of the bridges between the root complex and `address`, nearest the root first."""
    path = f"/sys/bus/pci/devices/{address}"
    try:
        target = os.readlink(under(root, path))
    except OSError as err:
        return unknown(f"cannot resolve {path}: {err.strerror or err}", path)
    parts = [p for p in Path(target).parts if BDF.match(p)]
    return known([p.lower() for p in parts if p.lower() != address.lower()], path)


@dataclass(frozen=True)
class PcieCapabilityFacts:
    """What lspci says about one NVIDIA GPU and the bridges above it."""

    address: str
    max_payload: Fact  # bytes in use
    max_payload_supported: Fact  # bytes the GPU can do
    max_read_request: Fact  # bytes
    relaxed_ordering: Fact  # True when enabled
    resizable_bar: Fact  # {"bar", "current_bytes", "max_bytes"} of the largest BAR, or None
    upstream: Fact  # bridge addresses above the GPU, nearest the root first
    acs_redirect: Fact  # {bridge: [redirect flags on]} for bridges that redirect; {} when none


def _gpu_facts(
    address: str, devices: dict[str, LspciDevice], upstream: Fact
) -> PcieCapabilityFacts:
    device = devices.get(address)
    if device is None or device.access_denied:
        why = "not in lspci output" if device is None else "lspci: <access denied> (needs root)"
        missing = unknown(why, SOURCE)
        return PcieCapabilityFacts(address, *[missing] * 5, upstream, missing)

    def fact(value: object, what: str) -> Fact:
        return (
            known(value, SOURCE) if value is not None else unknown(f"lspci shows no {what}", SOURCE)
        )

    largest = max(device.resizable_bars, key=lambda b: b.current_bytes, default=None)
    rebar = (
        known(
            {
                "bar": largest.index,
                "current_bytes": largest.current_bytes,
                "max_bytes": max(largest.supported_bytes),
            },
            SOURCE,
        )
        if largest
        else known(None, SOURCE)  # no Resizable BAR capability: a fixed BAR
    )
    return PcieCapabilityFacts(
        address=address,
        max_payload=fact(device.max_payload, "DevCtl MaxPayload"),
        max_payload_supported=fact(device.max_payload_supported, "DevCap MaxPayload"),
        max_read_request=fact(device.max_read_request, "DevCtl MaxReadReq"),
        relaxed_ordering=fact(device.relaxed_ordering, "DevCtl RlxdOrd"),
        resizable_bar=rebar,
        upstream=upstream,
        acs_redirect=_acs(devices, upstream),
    )


def _acs(devices: dict[str, LspciDevice], upstream: Fact) -> Fact:
    if not upstream.known:
        return unknown(f"bridges above the GPU unknown: {upstream.reason}", SOURCE)
    redirects: dict[str, list[str]] = {}
    for bridge in upstream.value:
        device = devices.get(bridge)
        if device is not None and device.access_denied:
            return unknown(f"lspci: <access denied> for bridge {bridge} (needs root)", SOURCE)
        flags = (device.acs_control or {}) if device else {}
        on = [name for name in ACS_REDIRECT_FLAGS if flags.get(name)]
        if on:
            redirects[bridge] = on
    return known(redirects, SOURCE)


def pcie_capabilities(
    lspci: Fact, root: Path, gpu_addresses: list[str]
) -> list[PcieCapabilityFacts]:
    """Facts per GPU address from lspci text (`read_lspci`) and the sysfs tree under `root`."""
    if not lspci.known:
        missing = unknown(lspci.reason or "", lspci.source)
        return [
            PcieCapabilityFacts(a, *[missing] * 5, upstream_bridges(root, a), missing)
            for a in gpu_addresses
        ]
    devices = parse_lspci(lspci.value)
    return [_gpu_facts(a, devices, upstream_bridges(root, a)) for a in gpu_addresses]

"""Environment detection on fake root trees (real files in tmp_path) and on this machine's /."""

from __future__ import annotations

from pathlib import Path

import pytest

from baselines.environment import KINDS, Environment, detect_environment
from host_tuning.nvml import SimulatedNvml

FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep avx2 avx512f"


def tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def cpuinfo(hypervisor: bool) -> str:
    flags = FLAGS + (" hypervisor" if hypervisor else "")
    return f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n"


def host(
    root: Path,
    *,
    hypervisor: bool,
    vendor: str | None = None,
    product: str | None = None,
    cgroup: str = "0::/\n",
    cmdline: str = "BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro quiet\n",
    extra: dict[str, str] | None = None,
) -> Path:
    files = {
        "/proc/cpuinfo": cpuinfo(hypervisor),
        "/proc/1/cgroup": cgroup,
        "/proc/cmdline": cmdline,
        "/proc/sys/kernel/osrelease": "6.8.0-generic\n",
        "/proc/self/mounts": "/dev/sda1 / ext4 rw,relatime 0 0\n",
    }
    if vendor is not None:
        files["/sys/class/dmi/id/sys_vendor"] = vendor + "\n"
    if product is not None:
        files["/sys/class/dmi/id/product_name"] = product + "\n"
    return tree(root, {**files, **(extra or {})})


def test_bare_metal_server(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=False, vendor="Supermicro", product="SYS-421GE-TNRT")
    env = detect_environment(root=root)
    assert env.kind == "bare-metal"
    assert env.hypervisor_vendor is None
    assert not env.container
    assert any("no CPUID hypervisor flag" in e for e in env.evidence)


def test_kvm_guest_with_passed_through_gpu(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=True, vendor="QEMU", product="Standard PC (Q35 + ICH9, 2009)")
    nvml = SimulatedNvml.from_fixture("h200-passthrough-vm")
    env = detect_environment(root=root, nvml=nvml)
    assert env.kind == "vm-passthrough"
    assert env.gpu_virtualization_mode == "passthrough"
    assert env.hypervisor_vendor == "QEMU"
    assert any("NVML virtualization mode passthrough" in e for e in env.evidence)
    assert any("hypervisor flag" in e for e in env.evidence)


def test_vgpu_guest_is_a_vm(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=True, vendor="VMware, Inc.", product="VMware7,1")
    nvml = SimulatedNvml.from_fixture("h200-passthrough-vm", overrides={"virtualization_mode": 2})
    env = detect_environment(root=root, nvml=nvml)
    assert env.kind == "vm"
    assert env.gpu_virtualization_mode == "vgpu"
    assert env.hypervisor_vendor == "VMware, Inc."


def test_gpu_on_bare_metal_reports_mode_none(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=False, vendor="ASUS", product="Pro WS")
    nvml = SimulatedNvml.from_fixture("rtx4090-consumer", overrides={"virtualization_mode": 0})
    env = detect_environment(root=root, nvml=nvml)
    assert env.kind == "bare-metal"
    assert env.gpu_virtualization_mode == "none"


@pytest.mark.parametrize(
    ("vendor", "product"),
    [
        ("Amazon EC2", "p5.48xlarge"),
        ("Google", "Google Compute Engine"),
        ("Microsoft Corporation", "Virtual Machine"),
        ("QEMU", "Standard PC (i440FX + PIIX, 1996)"),
    ],
)
def test_cloud_vm_without_gpu(tmp_path: Path, vendor: str, product: str) -> None:
    env = detect_environment(root=host(tmp_path, hypervisor=True, vendor=vendor, product=product))
    assert env.kind == "vm"
    assert env.hypervisor_vendor == vendor
    assert any(vendor in e for e in env.evidence)


def test_cloud_metal_instance_is_bare_metal(tmp_path: Path) -> None:
    env = detect_environment(
        root=host(tmp_path, hypervisor=False, vendor="Amazon EC2", product="c5.metal")
    )
    assert env.kind == "bare-metal"


def test_docker_container_on_bare_metal(tmp_path: Path) -> None:
    root = host(
        tmp_path,
        hypervisor=False,
        cgroup="0::/system.slice/docker-3f2a9c.scope\n",
        extra={"/.dockerenv": ""},
    )
    env = detect_environment(root=root)
    assert env.kind == "container"
    assert env.container
    assert "/.dockerenv present" in env.evidence
    assert any("cgroup" in e for e in env.evidence)


def test_podman_container(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=False, extra={"/run/.containerenv": ""})
    env = detect_environment(root=root)
    assert env.kind == "container"
    assert "/run/.containerenv present" in env.evidence


def test_gvisor_sandbox(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=False, cmdline="BOOT_IMAGE=/vmlinuz-4.4.0-gvisor quiet\n")
    env = detect_environment(root=root)
    assert env.kind == "container"
    assert env.sandbox == "gvisor"


def test_kata_guest_is_a_vm_and_a_container(tmp_path: Path) -> None:
    root = host(
        tmp_path,
        hypervisor=True,
        vendor="QEMU",
        product="Standard PC (Q35 + ICH9, 2009)",
        extra={"/proc/self/mounts": "kataShared / virtiofs rw,relatime 0 0\n"},
    )
    env = detect_environment(root=root)
    assert env.kind == "vm"
    assert env.sandbox == "kata"
    assert env.container


def test_container_inside_a_vm_is_a_vm(tmp_path: Path) -> None:
    root = host(tmp_path, hypervisor=True, extra={"/.dockerenv": ""})
    env = detect_environment(root=root)
    assert env.kind == "vm"
    assert env.container
    assert "/.dockerenv present" in env.evidence


def test_nothing_readable_is_unknown(tmp_path: Path) -> None:
    env = detect_environment(root=tmp_path)
    assert env.kind == "unknown"
    assert env.evidence == []


def test_this_machine() -> None:
    env = detect_environment()
    assert env.kind in KINDS
    flags = next(
        (
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ),
        None,
    )
    if flags is not None and "hypervisor" in flags.split():
        assert env.kind in ("vm", "vm-passthrough")
        assert env.evidence
    if Path("/.dockerenv").exists():
        assert env.container


def test_round_trip_and_bad_documents(tmp_path: Path) -> None:
    env = detect_environment(root=host(tmp_path, hypervisor=True, vendor="QEMU", product="pc"))
    assert Environment.from_dict(env.to_dict()) == env
    with pytest.raises(ValueError, match=r"environment\.kind"):
        Environment.from_dict({**env.to_dict(), "kind": "mainframe"})
    with pytest.raises(ValueError, match=r"environment\.evidence"):
        Environment.from_dict({**env.to_dict(), "evidence": "flag"})
    with pytest.raises(ValueError, match="must be an object"):
        Environment.from_dict(["vm"])

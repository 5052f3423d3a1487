"""Driver discovery against fake library folders laid out like real distributions' and a
container's, and through the real command line and the real dynamic loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.driver_discovery import (
    CUDA,
    NVML,
    PTXJIT,
    DriverDirError,
    default_roots,
    find_driver_libs,
    parse_ldconfig,
    prepare_driver_dir,
    version_from_name,
)

REPO = Path(__file__).resolve().parents[2]
DRIVER_FAMILIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so")

# Recorded on the lent H200 (a container: driver mounted at /usr/local/nvidia/lib64), trimmed
# to the driver's lines; the test rewrites the paths into its fake root.
H200_LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /lib/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/libnvidia-ml.so.1
\tlibnvidia-gpucomp.so.580.159.04 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.159.04
\tlibcudart.so.13 (libc6,x86-64) => /usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.13
\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1
"""
H200_KERNEL = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
    "(nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n"
)


def install_driver(
    folder: Path,
    version: str,
    families: tuple[str, ...] = DRIVER_FAMILIES,
    content: bytes = b"\x7fELF fake driver",
) -> None:
    """Lay out a driver the way NVIDIA's packages do: real file, soname link, bare .so link."""
    folder.mkdir(parents=True, exist_ok=True)
    for family in families:
        (folder / f"{family}.{version}").write_bytes(content)
        (folder / f"{family}.1").symlink_to(f"{family}.{version}")
        (folder / family).symlink_to(f"{family}.1")


def host_noise(folder: Path) -> None:
    """Libraries a host folder also holds, which must never reach the private folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("libssl.so.3", "libstdc++.so.6", "libcudart.so.12", "libnvidia-egl-wayland.so.1"):
        (folder / name).write_bytes(b"not the driver")


def linked(dest: Path) -> dict[str, Path]:
    return {p.name: Path(os.readlink(p)) for p in sorted(dest.iterdir())}


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance.driver_discovery", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_ubuntu_via_ldconfig_links_only_the_driver(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    install_driver(lib, "580.95.05")
    install_driver(lib, "580.95.05", families=("libnvidia-gpucomp.so",))
    (lib / "libnvidia-gpucomp.so.575.57.08").write_bytes(b"left over from the last driver")
    host_noise(lib)
    i386 = tmp_path / "usr/lib/i386-linux-gnu"
    install_driver(i386, "580.95.05")
    ldconfig = (
        f"\tlibcuda.so.1 (libc6) => {i386}/libcuda.so.1\n"
        f"\tlibcuda.so.1 (libc6,x86-64) => {lib}/libcuda.so.1\n"
        f"\tlibnvidia-ml.so.1 (libc6,x86-64) => {lib}/libnvidia-ml.so.1\n"
    )

    libs = find_driver_libs(
        default_roots(tmp_path), ldconfig, machine="x86_64", kernel_version_file=None
    )

    assert libs.found and libs.source == "ldconfig"
    assert libs.version == "580.95.05"
    assert libs.directory == lib
    assert [x.soname for x in libs.libs] == [CUDA, NVML, PTXJIT]
    assert all(x.real_path.parent == lib for x in libs.libs)
    assert libs.missing == () and libs.warnings() == []

    dest = prepare_driver_dir(libs, tmp_path / "private")
    links = linked(dest)
    expected = {
        f"{family}{suffix}"
        for family in (*DRIVER_FAMILIES, "libnvidia-gpucomp.so")
        for suffix in ("", ".1", ".580.95.05")
    }
    assert set(links) == expected
    assert links["libcuda.so.1"] == lib / "libcuda.so.580.95.05"
    assert all(target.is_absolute() and target.parent == lib for target in links.values())
    assert (dest / "libcuda.so.1").read_bytes() == b"\x7fELF fake driver"


def test_ubuntu_without_ldconfig_is_found_in_the_multiarch_folder(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    install_driver(lib, "570.172.08")

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)

    assert libs.source == "directory"
    assert libs.version == "570.172.08"
    assert libs.cuda is not None and libs.cuda.path == lib / CUDA


def test_debian_alternatives_resolve_to_nvidia_current(tmp_path: Path) -> None:
    multiarch = tmp_path / "usr/lib/x86_64-linux-gnu"
    current = multiarch / "nvidia/current"
    install_driver(current, "535.247.01")
    alternatives = tmp_path / "etc/alternatives"
    alternatives.mkdir(parents=True)
    (alternatives / "nvidia--libcuda.so.1-x86_64-linux-gnu").symlink_to(current / CUDA)
    (multiarch / CUDA).symlink_to(alternatives / "nvidia--libcuda.so.1-x86_64-linux-gnu")
    host_noise(multiarch)

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)

    assert libs.found and libs.version == "535.247.01"
    assert libs.directory == multiarch
    assert libs.cuda is not None and libs.cuda.real_path == current / "libcuda.so.535.247.01"
    nvml = next(x for x in libs.libs if x.soname == NVML)
    assert nvml.path == current / NVML
    links = linked(prepare_driver_dir(libs, tmp_path / "private"))
    assert links["libcuda.so.1"] == current / "libcuda.so.535.247.01"
    assert not any(name.startswith(("libssl", "libstdc++", "libcudart")) for name in links)


def test_rhel_lib64(tmp_path: Path) -> None:
    lib64 = tmp_path / "usr/lib64"
    install_driver(lib64, "570.124.06")
    host_noise(lib64)
    kernel = tmp_path / "version"
    kernel.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Wed Feb 26\n")

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=kernel)

    assert libs.directory == lib64 and libs.version == "570.124.06"
    assert libs.kernel_module_version == "570.124.06"
    assert libs.warnings() == []
    assert "NVIDIA driver 570.124.06 from" in libs.summary()


def test_container_layout_recorded_on_the_h200(tmp_path: Path) -> None:
    nvidia = tmp_path / "usr/local/nvidia/lib64"
    install_driver(nvidia, "580.159.04")
    install_driver(nvidia, "580.159.04", families=("libnvidia-gpucomp.so", "libnvidia-nvvm.so"))
    kernel = tmp_path / "proc/driver/nvidia/version"
    kernel.parent.mkdir(parents=True)
    kernel.write_text(H200_KERNEL)
    ldconfig = H200_LDCONFIG.replace("/usr/local/nvidia", str(tmp_path / "usr/local/nvidia"))

    libs = find_driver_libs(
        default_roots(tmp_path), ldconfig, machine="x86_64", kernel_version_file=kernel
    )

    assert libs.source == "ldconfig" and libs.directory == nvidia
    assert libs.version == libs.kernel_module_version == "580.159.04"
    assert {p.name for p in libs.companions} >= {
        "libnvidia-gpucomp.so.580.159.04",
        "libnvidia-nvvm.so.1",
    }
    links = linked(prepare_driver_dir(libs, tmp_path / "private"))
    assert links["libnvidia-nvvm.so.1"] == nvidia / "libnvidia-nvvm.so.580.159.04"


def test_old_ubuntu_driver_folders_newest_branch_first(tmp_path: Path) -> None:
    install_driver(tmp_path / "usr/lib/nvidia-470", "470.256.02")
    install_driver(tmp_path / "usr/lib/nvidia-535", "535.247.01")
    host_noise(tmp_path / "usr/lib/x86_64-linux-gnu")

    roots = default_roots(tmp_path)
    libs = find_driver_libs(roots, "", kernel_version_file=None)

    assert roots.index(tmp_path / "usr/lib/nvidia-535") < roots.index(
        tmp_path / "usr/lib/nvidia-470"
    )
    assert (libs.source, libs.version) == ("directory", "535.247.01")
    assert libs.directory == tmp_path / "usr/lib/nvidia-535" and libs.missing == ()
    assert all(lib.real_path.parent == libs.directory for lib in libs.libs)


def test_nixos_uses_the_system_driver_folder_first(tmp_path: Path) -> None:
    store = tmp_path / "nix/store/0v7y3j3c1zq4-nvidia-x11-580.95.05-6.12.41/lib"
    install_driver(store, "580.95.05")
    opengl = tmp_path / "run/opengl-driver/lib"
    opengl.mkdir(parents=True)
    for family in DRIVER_FAMILIES:
        (opengl / f"{family}.1").symlink_to(store / f"{family}.1")
    install_driver(tmp_path / "usr/lib/x86_64-linux-gnu", "550.163.01")

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)

    assert libs.source == "nixos"
    assert libs.directory == opengl and libs.version == "580.95.05"

    done = run_cli("--print", "--root", str(tmp_path), "--no-ldconfig")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(opengl)
    assert "580.95.05" in done.stderr


def test_wsl_has_no_version_in_the_file_name(tmp_path: Path) -> None:
    wsl = tmp_path / "usr/lib/wsl/lib"
    wsl.mkdir(parents=True)
    for name in ("libcuda.so.1.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"):
        (wsl / name).write_bytes(b"wsl")
    (wsl / CUDA).symlink_to("libcuda.so.1.1")
    (wsl / "libdxcore.so").write_bytes(b"dxcore")

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)

    assert libs.found and libs.version is None
    assert "unknown version" in libs.summary()
    links = linked(prepare_driver_dir(libs, tmp_path / "private"))
    assert {"libcuda.so.1", "libcuda.so.1.1", "libcuda.so", "libdxcore.so"} <= set(links)


def test_nothing_found_says_where_it_looked(tmp_path: Path) -> None:
    host_noise(tmp_path / "usr/lib/x86_64-linux-gnu")

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)

    assert not libs.found and libs.source == "none"
    assert libs.missing == (CUDA, NVML, PTXJIT)
    assert "no NVIDIA driver found" in libs.summary()
    assert str(tmp_path / "usr/lib64") in libs.summary()
    with pytest.raises(DriverDirError, match="no NVIDIA driver found"):
        prepare_driver_dir(libs, tmp_path / "private")
    assert not (tmp_path / "private").exists()

    done = run_cli("--print", "--root", str(tmp_path), "--no-ldconfig")
    assert done.returncode == 0 and done.stdout == ""
    assert "no NVIDIA driver found" in done.stderr and "running without a GPU" in done.stderr
    required = run_cli("--print", "--require", "--quiet", "--root", str(tmp_path), "--no-ldconfig")
    assert required.returncode == 1 and required.stdout == ""
    assert "no NVIDIA driver found" in required.stderr


def test_missing_ptxjit_and_version_mismatches_are_warned(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64"
    install_driver(lib, "580.95.05", families=("libcuda.so",))
    install_driver(lib, "575.64.03", families=("libnvidia-ml.so",))
    kernel = tmp_path / "version"
    kernel.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.64.03  ...\n")

    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=kernel)

    assert libs.missing == (PTXJIT,)
    warnings = "\n".join(libs.warnings())
    assert f"{PTXJIT} not found" in warnings
    assert "different versions" in warnings
    assert "kernel module is 575.64.03 but libcuda is 580.95.05" in warnings


def test_ldconfig_abi_filter() -> None:
    output = (
        "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
        "\tlibcuda.so.1 (libc6,AArch64) => /usr/lib/aarch64-linux-gnu/libcuda.so.1\n"
        "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n"
        "\tlibfoo.so.2 (libc6,x86-64, OS ABI: Linux 3.2.0) => /usr/lib/libfoo.so.2\n"
        "garbage line\n"
    )
    assert parse_ldconfig(output, "aarch64") == {
        "libcuda.so.1": [Path("/usr/lib/aarch64-linux-gnu/libcuda.so.1")]
    }
    x86 = parse_ldconfig(output, "x86_64")
    assert x86["libcuda.so.1"] == [Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1")]
    assert x86["libfoo.so.2"] == [Path("/usr/lib/libfoo.so.2")]


@pytest.mark.parametrize(
    ("name", "family", "version"),
    [
        ("libcuda.so.580.95.05", "libcuda.so", "580.95.05"),
        ("libnvidia-ml.so.535.247.01", "libnvidia-ml.so", "535.247.01"),
        ("libcuda.so.1", "libcuda.so", None),
        ("libcuda.so.1.1", "libcuda.so", None),
        ("libcuda.so", "libcuda.so", None),
        ("libnvidia-ml.so.580.95.05", "libcuda.so", None),
    ],
)
def test_version_from_name(name: str, family: str, version: str | None) -> None:
    assert version_from_name(name, family) == version


def test_prepare_is_repeatable_and_never_clobbers_a_file(tmp_path: Path) -> None:
    install_driver(tmp_path / "usr/lib64", "580.95.05")
    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)
    dest = tmp_path / "private"

    first = linked(prepare_driver_dir(libs, dest))
    assert linked(prepare_driver_dir(libs, dest)) == first

    (dest / "libcuda.so.1").unlink()
    (dest / "libcuda.so.1").write_bytes(b"someone else's file")
    with pytest.raises(DriverDirError, match="not a symlink"):
        prepare_driver_dir(libs, dest)


def test_cli_json_and_print_into_a_private_folder(tmp_path: Path) -> None:
    install_driver(tmp_path / "usr/lib/x86_64-linux-gnu", "580.95.05")

    shown = run_cli("--json", "--root", str(tmp_path), "--no-ldconfig")
    assert shown.returncode == 0
    record = json.loads(shown.stdout)
    assert record["found"] is True and record["version"] == "580.95.05"
    assert [x["soname"] for x in record["libs"]] == [CUDA, NVML, PTXJIT]

    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run-user")}
    (tmp_path / "run-user").mkdir()
    printed = run_cli("--print", "--root", str(tmp_path), "--no-ldconfig", env=env)
    assert printed.returncode == 0, printed.stderr
    private = Path(printed.stdout.strip())
    assert private.parent == tmp_path / "run-user"
    assert private.name.startswith("autotune-driver-")
    assert (private.stat().st_mode & 0o777) == 0o700
    assert (private / CUDA).resolve() == tmp_path / "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    assert "NVIDIA driver 580.95.05 from" in printed.stderr


def test_cli_reports_an_unwritable_destination(tmp_path: Path) -> None:
    install_driver(tmp_path / "usr/lib64", "580.95.05")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder should go")

    done = run_cli(
        "--print", "--root", str(tmp_path), "--no-ldconfig", "--dest", str(blocker / "d")
    )

    assert done.returncode == 2 and done.stdout == ""
    assert "cannot link the driver" in done.stderr and "Traceback" not in done.stderr


def _real_shared_library() -> Path | None:
    for candidate in (
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        "/lib/aarch64-linux-gnu/libz.so.1",
        "/usr/lib/aarch64-linux-gnu/libz.so.1",
        "/usr/lib64/libz.so.1",
    ):
        if Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


def test_the_dynamic_loader_finds_libcuda_through_the_private_folder(tmp_path: Path) -> None:
    real = _real_shared_library()
    if real is None:
        pytest.skip("no libz.so.1 to stand in for a driver library on this machine")
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    install_driver(lib, "580.95.05", content=real.read_bytes())
    dest = tmp_path / "private"
    done = run_cli("--print", "--root", str(tmp_path), "--no-ldconfig", "--dest", str(dest))
    assert done.returncode == 0, done.stderr

    probe = (
        "import ctypes, sys\n"
        "try:\n"
        "    ctypes.CDLL('libcuda.so.1')\n"
        "except OSError as exc:\n"
        "    sys.exit(f'not loadable: {exc}')\n"
        "maps = open('/proc/self/maps').read()\n"
        f"sys.exit(0 if {str(lib / 'libcuda.so.580.95.05')!r} in maps else 'not mapped')\n"
    )
    without = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    with_dir = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LD_LIBRARY_PATH": done.stdout.strip()},
    )
    assert without.returncode != 0
    assert with_dir.returncode == 0, with_dir.stderr

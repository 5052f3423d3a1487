"""Find the host's NVIDIA user-space driver and expose only its libraries to the loader.

A Nix-built program does not search the host's library folders, so on a non-NixOS host it
cannot see the driver (libcuda, NVML, the PTX JIT) wherever the distribution installed it.
Pointing LD_LIBRARY_PATH at that whole folder would also hand the program the host's libstdc++,
libssl and the rest, which is exactly what Nix avoids. Instead the driver libraries (and their
versioned siblings) are symlinked into a private folder that the Nix wrapper prepends to
LD_LIBRARY_PATH. On NixOS the system's /run/opengl-driver/lib is used as it is.

Standard library only: the wrapper runs this file before anything else is importable.
`python -m appliance.driver_discovery --print` prints that folder (nothing when no driver was
found) on stdout and says on stderr which driver it found.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

NIXOS_DRIVER_DIR = Path("/run/opengl-driver/lib")
KERNEL_VERSION_FILE = Path("/proc/driver/nvidia/version")

CUDA = "libcuda.so.1"
NVML = "libnvidia-ml.so.1"
PTXJIT = "libnvidia-ptxjitcompiler.so.1"
SONAMES = (CUDA, NVML, PTXJIT)

# Loaded by libcuda itself on some drivers and platforms (the WSL bridge, the compiler
# back end of 530+ drivers, NVVM, the debugger); linked alongside when present.
COMPANION_FAMILIES = (
    "libnvidia-gpucomp.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
    "libdxcore.so",
)

# Where distributions and container runtimes put the driver, under a root prefix.
WELL_KNOWN_DIRS = (
    "run/opengl-driver/lib",  # NixOS
    "usr/lib/x86_64-linux-gnu",  # Ubuntu, Debian (alternatives links)
    "usr/lib/x86_64-linux-gnu/nvidia/current",  # Debian's packaged driver
    "usr/lib64",  # RHEL, Rocky, Fedora, SUSE
    "usr/lib/aarch64-linux-gnu",  # Ubuntu/Debian on Arm (GH200, Grace)
    "usr/lib/aarch64-linux-gnu/nvidia/current",
    "usr/local/nvidia/lib64",  # containers (Kubernetes device plugin, many GPU clouds)
    "usr/local/nvidia/lib",
    "usr/lib/wsl/lib",  # WSL 2
    "usr/lib",  # Arch
    "usr/lib/nvidia",  # driver packages that keep their own folder
    "usr/lib/nvidia-*",  # older Ubuntu packaging (nvidia-470, ...), newest first
    "usr/lib64/nvidia",
)

LDCONFIG_CANDIDATES = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/sbin/ldconfig.real")

# ldconfig -p names the ABI of each entry; keep only the running machine's (a 64-bit host
# often also carries the 32-bit driver, which must never be handed to a 64-bit process).
LDCONFIG_ABI = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "AArch64", "arm64": "AArch64"}

_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S.*?)\s*$")
_DRIVER_VERSION = re.compile(r"^\d{3,}\.\d+(?:\.\d+)?$")
_KERNEL_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d{3,}\.\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class DriverLib:
    """One driver library as found: the name asked for, where, and the file behind it."""

    soname: str
    path: Path
    real_path: Path
    version: str | None


@dataclass(frozen=True)
class DriverLibs:
    """What a search found: the libraries, what is missing, and where it looked."""

    libs: tuple[DriverLib, ...]
    missing: tuple[str, ...]
    searched: tuple[Path, ...]
    source: str  # "nixos", "ldconfig", "directory" or "none"
    companions: tuple[Path, ...] = ()
    kernel_module_version: str | None = None

    @property
    def found(self) -> bool:
        return self.cuda is not None

    @property
    def cuda(self) -> DriverLib | None:
        return next((lib for lib in self.libs if lib.soname == CUDA), None)

    @property
    def version(self) -> str | None:
        return self.cuda.version if self.cuda else None

    @property
    def directory(self) -> Path | None:
        return self.cuda.path.parent if self.cuda else None

    def warnings(self) -> list[str]:
        """Problems worth a line: missing companions of libcuda, mixed versions."""
        if not self.found:
            return []
        out = [f"{name} not found next to libcuda" for name in self.missing]
        versions = {lib.soname: lib.version for lib in self.libs if lib.version}
        if len(set(versions.values())) > 1:
            listed = ", ".join(f"{name} {version}" for name, version in versions.items())
            out.append(f"driver libraries of different versions: {listed}")
        kernel = self.kernel_module_version
        if kernel and self.version and kernel != self.version:
            out.append(
                f"kernel module is {kernel} but libcuda is {self.version}: "
                "CUDA will fail with 'driver/library version mismatch' until they agree"
            )
        return out

    def summary(self) -> str:
        """Human sentences: which driver, from where, and anything wrong."""
        if not self.found:
            looked = ", ".join(str(p) for p in self.searched) or "nowhere"
            return (
                f"no NVIDIA driver found: {CUDA} is in none of {looked} nor in the ldconfig cache"
            )
        assert self.cuda is not None
        version = self.version or "unknown version"
        names = ", ".join(lib.soname for lib in self.libs)
        lines = [
            f"NVIDIA driver {version} from {self.directory} "
            f"({names}; via {self.source}; libcuda is {self.cuda.real_path})"
        ]
        lines += [f"warning: {w}" for w in self.warnings()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """A JSON-ready record (for --json and for report fingerprints)."""
        return {
            "found": self.found,
            "version": self.version,
            "source": self.source,
            "directory": str(self.directory) if self.directory else None,
            "kernel_module_version": self.kernel_module_version,
            "libs": [
                {
                    "soname": lib.soname,
                    "path": str(lib.path),
                    "real_path": str(lib.real_path),
                    "version": lib.version,
                }
                for lib in self.libs
            ],
            "companions": [str(p) for p in self.companions],
            "missing": list(self.missing),
            "searched": [str(p) for p in self.searched],
            "warnings": self.warnings(),
        }


class DriverDirError(RuntimeError):
    """The private driver folder could not be made."""


def default_roots(prefix: Path = Path("/")) -> list[Path]:
    """The well-known driver folders, NixOS's first, under `prefix` (a fake root in tests).

    A pattern (`usr/lib/nvidia-*`) gives the folders it matches, highest driver branch first.
    """
    roots: list[Path] = []
    for entry in WELL_KNOWN_DIRS:
        if "*" in entry:
            roots += sorted(prefix.glob(entry), key=_branch_key, reverse=True)
        else:
            roots.append(prefix / entry)
    return roots


def read_ldconfig_cache() -> str:
    """`ldconfig -p` of the host, or "" where there is no ldconfig (NixOS) or it fails."""
    for candidate in LDCONFIG_CANDIDATES:
        if not os.access(candidate, os.X_OK):
            continue
        try:
            done = subprocess.run(
                [candidate, "-p"], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return done.stdout
    return ""


def parse_ldconfig(output: str, machine: str) -> dict[str, list[Path]]:
    """Map each library name in `ldconfig -p` output to its paths for this machine's ABI."""
    abi = LDCONFIG_ABI.get(machine.lower())
    entries: dict[str, list[Path]] = {}
    for line in output.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if not match:
            continue
        name, flags, path = match.groups()
        tokens = [t.strip() for t in flags.split(",")]
        if abi is not None and abi not in tokens:
            continue
        entries.setdefault(name, []).append(Path(path))
    return entries


def read_kernel_module_version(path: Path = KERNEL_VERSION_FILE) -> str | None:
    """The loaded kernel module's version from /proc/driver/nvidia/version, if any."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    match = _KERNEL_VERSION.search(text)
    return match.group(1) if match else None


def family_of(soname: str) -> str:
    """`libcuda.so.1` -> `libcuda.so`."""
    head, sep, _ = soname.partition(".so")
    return head + sep


def version_from_name(file_name: str, family: str) -> str | None:
    """`libcuda.so.580.95.05` -> `580.95.05`; None where the name carries no driver version."""
    if not file_name.startswith(family + "."):
        return None
    suffix = file_name[len(family) + 1 :]
    return suffix if _DRIVER_VERSION.match(suffix) else None


def find_driver_libs(
    roots: list[Path] | None = None,
    ldconfig_output: str | None = None,
    *,
    machine: str | None = None,
    kernel_version_file: Path | None = KERNEL_VERSION_FILE,
) -> DriverLibs:
    """Find libcuda, NVML and the PTX JIT of the host's driver.

    Order: the NixOS driver folder, then the ldconfig cache (`ldconfig_output`, read from the
    host when None, skipped when ""), then the other `roots` (default: `default_roots()`).
    The other libraries are taken from libcuda's own folder first, so that one driver's files
    are used together.
    """
    roots = default_roots() if roots is None else list(roots)
    if ldconfig_output is None:
        ldconfig_output = read_ldconfig_cache()
    cache = parse_ldconfig(ldconfig_output, machine or platform.machine())
    kernel = read_kernel_module_version(kernel_version_file) if kernel_version_file else None

    nixos_roots = [r for r in roots if _is_nixos_dir(r)]
    plain_roots = [r for r in roots if not _is_nixos_dir(r)]
    candidates = (
        [(r, "nixos") for r in nixos_roots]
        + [(p.parent, "ldconfig") for p in cache.get(CUDA, [])]
        + [(r, "directory") for r in plain_roots]
    )
    searched = tuple(dict.fromkeys(directory for directory, _ in candidates))

    hit = next(
        ((lib, source) for d, source in candidates if (lib := _lib_in(d, CUDA)) is not None),
        None,
    )
    if hit is None:
        return DriverLibs(
            libs=(), missing=SONAMES, searched=searched, source="none", kernel_module_version=kernel
        )
    cuda, source = hit

    near = list(dict.fromkeys([cuda.path.parent, cuda.real_path.parent]))
    libs = [cuda]
    missing = []
    for soname in (NVML, PTXJIT):
        dirs = near + [p.parent for p in cache.get(soname, [])] + plain_roots
        lib = next((x for x in (_lib_in(d, soname) for d in dirs) if x is not None), None)
        if lib is None:
            missing.append(soname)
        else:
            libs.append(lib)
    return DriverLibs(
        libs=tuple(libs),
        missing=tuple(missing),
        searched=searched,
        source=source,
        companions=tuple(_companions(near, cuda.version)),
        kernel_module_version=kernel,
    )


def prepare_driver_dir(libs: DriverLibs, dest: Path) -> Path:
    """Symlink just the driver's libraries (and their versioned siblings) into `dest`.

    Each library appears under its soname, its versioned file name and its bare `.so` name,
    all pointing at the real file on the host. Returns `dest`, ready for LD_LIBRARY_PATH.
    """
    if not libs.found:
        raise DriverDirError(libs.summary())
    links: dict[str, Path] = {}
    for lib in libs.libs:
        for name in _sibling_names(lib):
            links.setdefault(name, lib.real_path)
    for companion in libs.companions:
        real = companion.resolve()
        links.setdefault(companion.name, real)
        links.setdefault(real.name, real)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for name, target in sorted(links.items()):
            link = dest / name
            if link.is_symlink():
                link.unlink()
            elif link.exists():
                raise DriverDirError(f"{link} exists and is not a symlink; refusing to replace it")
            link.symlink_to(target)
    except OSError as exc:
        raise DriverDirError(f"cannot make the driver folder {dest}: {exc.strerror}") from exc
    return dest


def private_dir() -> Path:
    """A fresh folder only this user can write, for the driver links."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.access(base, os.W_OK):
        base = None
    return Path(tempfile.mkdtemp(prefix="autotune-driver-", dir=base))


def _branch_key(folder: Path) -> tuple[int, str]:
    """`nvidia-535` sorts after `nvidia-470`, and after `nvidia-99`."""
    digits = re.sub(r"\D", "", folder.name)
    return (int(digits) if digits else -1, folder.name)


def _is_nixos_dir(path: Path) -> bool:
    return path.parts[-3:] == ("run", "opengl-driver", "lib")


def _lib_in(directory: Path, soname: str) -> DriverLib | None:
    path = directory / soname
    try:
        if not path.is_file():
            return None
        real = path.resolve(strict=True)
    except OSError:
        return None
    return DriverLib(
        soname=soname,
        path=path,
        real_path=real,
        version=version_from_name(real.name, family_of(soname)),
    )


def _sibling_names(lib: DriverLib) -> list[str]:
    """The soname, the real file's name, the bare `.so`, and any other alias of the same file."""
    family = family_of(lib.soname)
    names = [lib.soname, lib.real_path.name, family]
    for folder in dict.fromkeys([lib.path.parent, lib.real_path.parent]):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(family + ".") and _resolves_to(entry, lib.real_path):
                names.append(entry.name)
    return list(dict.fromkeys(names))


def _companions(folders: list[Path], version: str | None) -> list[Path]:
    """Companion libraries of the same driver version (any version where it is unknown)."""
    found: dict[str, Path] = {}
    for folder in folders:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            family = next(
                (
                    f
                    for f in COMPANION_FAMILIES
                    if entry.name == f or entry.name.startswith(f + ".")
                ),
                None,
            )
            if family is None or entry.name in found:
                continue
            try:
                real = entry.resolve(strict=True)
            except OSError:
                continue
            if not real.is_file():
                continue
            real_version = version_from_name(real.name, family)
            if version is None or real_version is None or real_version == version:
                found[entry.name] = entry
    return list(found.values())


def _resolves_to(entry: Path, target: Path) -> bool:
    try:
        return entry.resolve(strict=True) == target
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    """CLI for the Nix wrapper and for people: see --help. Exit 0, 1 (no driver, --require), 2."""
    parser = argparse.ArgumentParser(
        prog="python -m appliance.driver_discovery",
        description="Find the host's NVIDIA driver libraries without exposing the whole host "
        "library folder.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--print",
        dest="print_dir",
        action="store_true",
        help="link the driver into a private folder and print that folder (for LD_LIBRARY_PATH)",
    )
    action.add_argument("--json", action="store_true", help="print what was found as JSON")
    parser.add_argument("--dest", type=Path, help="folder for the links (default: a fresh one)")
    parser.add_argument(
        "--root", type=Path, default=Path("/"), help="search under this root (default: /)"
    )
    parser.add_argument("--no-ldconfig", action="store_true", help="do not read the ldconfig cache")
    parser.add_argument("--require", action="store_true", help="exit 1 when no driver is found")
    parser.add_argument("--quiet", action="store_true", help="say nothing on stderr")
    args = parser.parse_args(argv)

    libs = find_driver_libs(
        default_roots(args.root),
        "" if args.no_ldconfig else None,
        kernel_version_file=args.root / KERNEL_VERSION_FILE.relative_to("/"),
    )
    status = 1 if args.require and not libs.found else 0

    if args.json:
        print(json.dumps(libs.to_dict(), indent=2))
        return status
    if not args.quiet or (args.require and not libs.found):
        tail = "" if libs.found or args.require else "; running without a GPU"
        print(f"autotune: {libs.summary()}{tail}", file=sys.stderr)
    if not args.print_dir or not libs.found:
        return status
    if libs.source == "nixos" and args.dest is None:
        print(libs.directory)
        return status
    try:
        print(prepare_driver_dir(libs, args.dest or private_dir()))
    except (DriverDirError, OSError) as exc:
        print(f"autotune: cannot link the driver: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())

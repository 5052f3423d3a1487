"""The environment fingerprint of a run: what code, which libraries, which driver and GPU, where.

Everything is read, nothing is changed. Whatever cannot be found is null (or
"unknown" for the git commit), never an exception. GPU serial numbers and
UUIDs are replaced by "redacted" unless the caller keeps them.

A run started by the Nix flake's wrapper (`nix run .#autotune`) has no checkout to read: the
wrapper passes the flake's revision, narHash, nixpkgs' revision, the lock files' hashes and
its own store path in `AUTOTUNE_NIX_*` variables (nix/run-with-driver.sh), and those fill
the `nix` block, the git state and the lock hashes.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.driver_discovery import DriverLibs, find_driver_libs

if TYPE_CHECKING:
    from host_tuning.nvml_base import NvmlBackend

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
REDACTED = "redacted"
UNKNOWN_COMMIT = "unknown"
GIT_TIMEOUT_S = 10
NVML_LIBRARY = "libnvidia-ml.so"
DIRTY = "dirty"
NIX_ENV_PREFIX = "AUTOTUNE_NIX_"
DRIVER_DIR_ENV = "AUTOTUNE_DRIVER_DIR"

_STORE_PATH = re.compile(r"^/nix/store/[0-9a-z]{32}-[^/]+$")
_REVISION = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class NixBuild:
    """Which flake build is running, as the `nix run` wrapper recorded it."""

    store_path: str
    flake_revision: str  # a commit, "<commit>-dirty" for an uncommitted tree, or "dirty"
    flake_dirty: bool
    flake_narhash: str | None
    nixpkgs_revision: str | None
    flake_lock_sha256: str | None
    uv_lock_sha256: str | None

    @property
    def commit(self) -> str:
        """The git commit the flake was built from, or "unknown" (a dirty path flake)."""
        head = self.flake_revision.removesuffix("-dirty")
        return head if _REVISION.match(head) else UNKNOWN_COMMIT

    def to_dict(self) -> dict:
        return asdict(self)


def collect_fingerprint(
    repo_dir: Path | None = None,
    *,
    keep_ids: bool = False,
    nvml: NvmlBackend | None = None,
    environ: Mapping[str, str] | None = None,
    driver: DriverLibs | None = None,
) -> dict:
    """Fingerprint of this process's environment, shaped like the report's `fingerprint`.

    `repo_dir` is the checkout whose commit and lock files count; by default the
    checkout this package runs from (none when installed from a wheel or Nix).
    `nvml` is an open NVML backend to read GPUs from (the caller keeps it open);
    by default the real NVML is opened and closed here. `environ` is where the Nix
    wrapper's variables are read (default: this process's environment). `driver` is
    the driver search result to record (default: a search of this host).
    """
    environ = os.environ if environ is None else environ
    if repo_dir is None:
        repo_dir = PACKAGE_ROOT if _is_repo_root(PACKAGE_ROOT) else None
    package_store_path = nix_store_path(Path(__file__)) or nix_store_path(Path(sys.prefix))
    nix = nix_build(environ, package_store_path)
    versions = _library_versions()
    gpus, nvml_system, note, library = _gpu_facts(nvml, keep_ids)
    driver = find_driver_libs() if driver is None else driver
    versions["driver"] = nvml_system.get("driver_version") or driver.version
    versions["nvml"] = nvml_system.get("nvml_version")
    git, locks = code_state(repo_dir, nix)
    return {
        "git": git,
        "locks": locks,
        "nix_store_path": nix.store_path if nix else package_store_path,
        "nix": nix.to_dict() if nix else None,
        "versions": versions,
        "driver_library": library,
        "driver": driver_facts(driver, environ.get(DRIVER_DIR_ENV) or None),
        "gpus": gpus,
        "host": _host(),
        "ids_redacted": not keep_ids,
        "note": note,
    }


def code_state(repo_dir: Path | None, nix: NixBuild | None) -> tuple[dict, dict]:
    """(git state, lock hashes): from the checkout when there is one, else from the Nix build."""
    if repo_dir is not None:
        locks = {
            "uv_lock_sha256": file_sha256(repo_dir / "uv.lock"),
            "flake_lock_sha256": file_sha256(repo_dir / "flake.lock"),
        }
        return git_state(repo_dir), locks
    if nix is not None:
        git = {"commit": nix.commit, "dirty": nix.flake_dirty}
        return git, {
            "uv_lock_sha256": nix.uv_lock_sha256,
            "flake_lock_sha256": nix.flake_lock_sha256,
        }
    return {"commit": UNKNOWN_COMMIT, "dirty": None}, {
        "uv_lock_sha256": None,
        "flake_lock_sha256": None,
    }


def nix_build(environ: Mapping[str, str], package_store_path: str | None) -> NixBuild | None:
    """The Nix wrapper's record of this build, or None when this is not a Nix run.

    Only trusted when this package itself lies in the Nix store: `AUTOTUNE_NIX_*` variables
    inherited by a checkout's run (say, from a shell that once ran the wrapper) describe some
    other build. Malformed values become None rather than being reported.
    """
    store_path = environ.get(NIX_ENV_PREFIX + "STORE_PATH", "")
    if package_store_path is None or not _STORE_PATH.match(store_path):
        return None
    revision = environ.get(NIX_ENV_PREFIX + "FLAKE_REV") or DIRTY
    if revision != DIRTY and not _REVISION.match(revision.removesuffix("-dirty")):
        revision = DIRTY
    return NixBuild(
        store_path=store_path,
        flake_revision=revision,
        flake_dirty=revision == DIRTY or revision.endswith("-dirty"),
        flake_narhash=_known(environ.get(NIX_ENV_PREFIX + "FLAKE_NARHASH")),
        nixpkgs_revision=_known(environ.get(NIX_ENV_PREFIX + "NIXPKGS_REV")),
        flake_lock_sha256=_sha256(environ.get(NIX_ENV_PREFIX + "FLAKE_LOCK_SHA256")),
        uv_lock_sha256=_sha256(environ.get(NIX_ENV_PREFIX + "UV_LOCK_SHA256")),
    )


def driver_facts(libs: DriverLibs, exposed_dir: str | None = None) -> dict:
    """The host driver as found: version, where, how, and each library's real file and hash.

    `exposed_dir` is the private folder the Nix wrapper put on LD_LIBRARY_PATH, if any.
    """
    return {
        "found": libs.found,
        "version": libs.version,
        "source": libs.source,
        "directory": str(libs.directory) if libs.directory else None,
        "exposed_dir": exposed_dir,
        "kernel_module_version": libs.kernel_module_version,
        "libraries": [
            {
                "soname": lib.soname,
                "path": str(lib.real_path),
                "version": lib.version,
                "sha256": file_sha256(lib.real_path),
            }
            for lib in libs.libs
        ],
        "warnings": libs.warnings(),
    }


def git_state(repo_dir: Path) -> dict:
    """{"commit": hash or "unknown", "dirty": bool, or None when not a git checkout}."""
    if _git(repo_dir, "rev-parse", "--show-toplevel") is None:
        return {"commit": UNKNOWN_COMMIT, "dirty": None}
    commit = _git(repo_dir, "rev-parse", "--verify", "--quiet", "HEAD")
    status = _git(repo_dir, "status", "--porcelain")
    return {
        "commit": commit.strip() if commit else UNKNOWN_COMMIT,
        "dirty": None if status is None else bool(status.strip()),
    }


def file_sha256(path: Path) -> str | None:
    """Hex SHA-256 of a file, or None when it is absent or unreadable."""
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def nix_store_path(path: Path) -> str | None:
    """The /nix/store/<hash>-<name> entry `path` lies in, or None outside the Nix store."""
    parts = path.resolve().parts
    if len(parts) >= 4 and parts[:3] == ("/", "nix", "store"):
        return "/nix/store/" + parts[3]
    return None


def loaded_library(fragment: str, maps: Path = Path("/proc/self/maps")) -> dict | None:
    """Path and SHA-256 of the first shared library mapped into this process whose path
    contains `fragment`, or None (not loaded, or no /proc)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fragment in fields[5] and fields[5].startswith("/"):
            path = fields[5].strip()
            return {"path": path, "sha256": file_sha256(Path(path))}
    return None


def redact_ids(gpu: dict, keep_ids: bool) -> dict:
    """A copy of a GPU record with uuid and serial replaced by "redacted" (unless kept)."""
    if keep_ids:
        return dict(gpu)
    return {k: REDACTED if k in ("uuid", "serial") and v is not None else v for k, v in gpu.items()}


def _known(value: str | None) -> str | None:
    return None if not value or value == "unknown" else value


def _sha256(value: str | None) -> str | None:
    return value if value and _SHA256.match(value) else None


def _is_repo_root(path: Path) -> bool:
    top = _git(path, "rev-parse", "--show-toplevel")
    return top is not None and Path(top.strip()).resolve() == path.resolve()


def _git(repo_dir: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo_dir), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _module_version(name: str) -> str | None:
    try:
        module = importlib.import_module(name)
    except Exception:  # a broken install counts as absent: the fingerprint must not fail
        return None
    version = getattr(module, "__version__", None)
    return str(version) if version is not None else None


def _library_versions() -> dict[str, Any]:
    from appliance import __version__

    cuda = None
    if _module_version("torch") is not None:
        import torch

        cuda = torch.version.cuda
    return {
        "autotune": __version__,
        "python": platform.python_version(),
        "torch": _module_version("torch"),
        "triton": _module_version("triton"),
        "cupy": _module_version("cupy"),
        "cuda_runtime": cuda,
        "driver": None,
        "nvml": None,
    }


def _gpu_facts(
    nvml: NvmlBackend | None, keep_ids: bool
) -> tuple[list[dict], dict[str, Any], str | None, dict | None]:
    """(GPU records, NVML system fields, note on why there are none, loaded NVML library)."""
    try:
        from host_tuning.nvml import NvmlError, probe_nvml
    except ImportError as err:
        return [], {}, f"no GPU facts: host_tuning.nvml is unavailable ({err})", None
    owned = nvml is None
    if owned:
        probe = probe_nvml()
        if probe.backend is None:
            return [], {}, f"no GPU facts: {probe.reason}", None
        nvml = probe.backend
    try:
        system = {
            field: nvml.read_system(field).value for field in ("driver_version", "nvml_version")
        }
        try:
            count = nvml.device_count()
        except NvmlError as err:
            return [], system, f"no GPU facts: {err}", None
        gpus = [redact_ids(_gpu(nvml, i), keep_ids) for i in range(count)]
        library = loaded_library(NVML_LIBRARY) if nvml.kind == "real" else None
        note = None if gpus else "NVML loaded but reports no GPUs"
        return gpus, system, note, library
    finally:
        if owned:
            nvml.close()


def _gpu(nvml: NvmlBackend, index: int) -> dict:
    def read(field: str) -> Any:
        return nvml.read(index, field).value

    capability = read("cuda_compute_capability")
    power_mw = read("power_limit_mw")
    return {
        "index": index,
        "name": read("name") or "unknown",
        "vbios": read("vbios_version"),
        "uuid": read("uuid"),
        "serial": read("serial"),
        "pci_bus_id": read("pci_bus_id"),
        "compute_capability": ".".join(str(p) for p in capability) if capability else None,
        "memory_total_bytes": read("memory_total_bytes"),
        "power_limit_w": power_mw / 1000 if power_mw is not None else None,
        "clocks_mhz": {
            "sm": read("clock_sm_current_mhz"),
            "mem": read("clock_memory_current_mhz"),
            "sm_max": read("clock_sm_max_mhz"),
            "mem_max": read("clock_memory_max_mhz"),
        },
    }


def _host() -> dict:
    return {
        "hostname": socket.gethostname(),
        "os": _os_name(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
    }


def _os_name() -> str:
    system = platform.system()
    try:
        release = platform.freedesktop_os_release()
    except OSError:
        return system
    pretty = release.get("PRETTY_NAME")
    return f"{system} ({pretty})" if pretty else system


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip() or None
    except OSError:
        pass
    return platform.processor() or None

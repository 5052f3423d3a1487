"""The environment fingerprint of a run: what code, which libraries, which driver and GPU, where.

Everything is read, nothing is changed. Whatever cannot be found is null (or
"unknown" for the git commit), never an exception. GPU serial numbers and
UUIDs are replaced by "redacted" unless the caller keeps them.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from host_tuning.nvml_base import NvmlBackend

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
REDACTED = "redacted"
UNKNOWN_COMMIT = "unknown"
GIT_TIMEOUT_S = 10
NVML_LIBRARY = "libnvidia-ml.so"


def collect_fingerprint(
    repo_dir: Path | None = None,
    *,
    keep_ids: bool = False,
    nvml: NvmlBackend | None = None,
) -> dict:
    """Fingerprint of this process's environment, shaped like the report's `fingerprint`.

    `repo_dir` is the checkout whose commit and lock files count; by default the
    checkout this package runs from (none when installed from a wheel or Nix).
    `nvml` is an open NVML backend to read GPUs from (the caller keeps it open);
    by default the real NVML is opened and closed here.
    """
    if repo_dir is None:
        repo_dir = PACKAGE_ROOT if _is_repo_root(PACKAGE_ROOT) else None
    versions = _library_versions()
    gpus, nvml_system, note, library = _gpu_facts(nvml, keep_ids)
    versions["driver"] = nvml_system.get("driver_version")
    versions["nvml"] = nvml_system.get("nvml_version")
    return {
        "git": git_state(repo_dir) if repo_dir else {"commit": UNKNOWN_COMMIT, "dirty": None},
        "locks": {
            "uv_lock_sha256": file_sha256(repo_dir / "uv.lock") if repo_dir else None,
            "flake_lock_sha256": file_sha256(repo_dir / "flake.lock") if repo_dir else None,
        },
        "nix_store_path": nix_store_path(Path(__file__)) or nix_store_path(Path(sys.prefix)),
        "versions": versions,
        "driver_library": library,
        "gpus": gpus,
        "host": _host(),
        "ids_redacted": not keep_ids,
        "note": note,
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

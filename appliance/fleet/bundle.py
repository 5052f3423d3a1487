"""The source bundle that provisioning ships: the files the appliance is built from (Python
packages, task folders, pyproject.toml with uv.lock, the flake), as one reproducible tarball
with a content hash. The hash is what makes provisioning idempotent."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

import appliance

FILES = ("pyproject.toml", "uv.lock", "README.md", "flake.nix", "flake.lock")
FOLDERS = ("appliance", "host_tuning", "baselines", "loop", "kernels", "nix")
SKIPPED_PARTS = {"__pycache__", ".autotune", ".pytest_cache", ".ruff_cache"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")


class BundleError(Exception):
    """No usable source tree to ship."""


@dataclass(frozen=True)
class Bundle:
    root: Path
    files: tuple[str, ...]
    sha256: str
    data: bytes

    @property
    def short(self) -> str:
        return self.sha256[:12]


def default_source() -> Path:
    """The checkout this appliance runs from (where pyproject.toml and uv.lock sit)."""
    return Path(appliance.__file__).resolve().parent.parent


def build_bundle(root: Path) -> Bundle:
    """Collect the shipped files under `root` into a deterministic .tar.gz and hash them."""
    for needed in ("pyproject.toml", "uv.lock", "appliance"):
        if not (root / needed).exists():
            raise BundleError(
                f"{root} is not an autotune checkout ({needed} missing); "
                "provision ships a checkout: pass --source DIR"
            )
    files = shipped_files(root)
    digest = hashlib.sha256()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            path = root / rel
            content = path.read_bytes()
            executable = bool(path.stat().st_mode & 0o111)
            digest.update(f"{rel}\0{int(executable)}\0{len(content)}\0".encode())
            digest.update(content)
            info = tarfile.TarInfo(rel)
            info.size = len(content)
            info.mode = 0o755 if executable else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(content))
    packed = gzip.compress(raw.getvalue(), mtime=0)
    return Bundle(root, tuple(files), digest.hexdigest(), packed)


def shipped_files(root: Path) -> list[str]:
    """The paths (relative, sorted) that a bundle of `root` holds."""
    found = [name for name in FILES if (root / name).is_file()]
    for folder in FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            rel = path.relative_to(root)
            if (
                path.is_file()
                and not path.is_symlink()
                and not SKIPPED_PARTS.intersection(rel.parts)
                and not path.name.endswith(SKIPPED_SUFFIXES)
            ):
                found.append(rel.as_posix())
    return sorted(found)

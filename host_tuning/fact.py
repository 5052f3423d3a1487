"""A single host fact (a value, or "unknown" and why) and the readers that make them.

Readers take the filesystem root as a parameter so a fake sysfs/procfs tree in a
temporary folder reads exactly like the real one. They never raise: a missing
file, a permission error or an absent tool becomes an unknown fact with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

REAL_ROOT = Path("/")
TOOL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Fact:
    """A value read from `source`, or value None with `reason` (the fact is unknown)."""

    value: Any = None
    reason: str | None = None
    source: str = ""

    @property
    def known(self) -> bool:
        return self.reason is None

    def map(self, fn: Callable[[Any], Any]) -> Fact:
        """Apply `fn` to a known value; a ValueError from `fn` makes the fact unknown."""
        if not self.known:
            return self
        try:
            return Fact(fn(self.value), None, self.source)
        except (ValueError, TypeError, IndexError, KeyError) as err:
            return Fact(None, f"cannot parse {self.value!r}: {err}", self.source)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "source": self.source}
        if not self.known:
            out["unknown"] = self.reason
        return out


def known(value: Any, source: str) -> Fact:
    return Fact(value, None, source)


def unknown(reason: str, source: str = "") -> Fact:
    return Fact(None, reason, source)


def under(root: Path, path: str) -> Path:
    """`path` (absolute, as on a real host) inside `root`."""
    return root / path.lstrip("/")


def read_text(root: Path, path: str) -> Fact:
    """The stripped text of a file; unknown with the reason when it cannot be read."""
    target = under(root, path)
    try:
        return known(target.read_text(errors="replace").strip(), path)
    except FileNotFoundError:
        return unknown(f"missing: {path}", path)
    except PermissionError:
        return unknown(f"permission denied: {path}", path)
    except IsADirectoryError:
        return unknown(f"unreadable: {path} is a directory", path)
    except OSError as err:
        return unknown(f"unreadable: {path}: {err.strerror or err}", path)


def read_int(root: Path, path: str) -> Fact:
    return read_text(root, path).map(int)


def list_dir(root: Path, path: str) -> Fact:
    """Sorted entry names of a folder, or unknown."""
    target = under(root, path)
    try:
        return known(sorted(p.name for p in target.iterdir()), path)
    except FileNotFoundError:
        return unknown(f"missing: {path}", path)
    except PermissionError:
        return unknown(f"permission denied: {path}", path)
    except OSError as err:
        return unknown(f"unreadable: {path}: {err.strerror or err}", path)


def link_name(root: Path, path: str) -> Fact:
    """Last component of the symlink target at `path` (a sysfs driver or iommu_group link)."""
    target = under(root, path)
    try:
        return known(Path(target.readlink()).name, path)
    except FileNotFoundError:
        return unknown(f"missing: {path}", path)
    except OSError as err:
        return unknown(f"unreadable link: {path}: {err.strerror or err}", path)


def exists(root: Path, path: str) -> Fact:
    """Whether `path` exists (a marker file); unknown only when the check itself fails."""
    try:
        return known(under(root, path).exists(), path)
    except OSError as err:
        return unknown(f"cannot check {path}: {err.strerror or err}", path)


def run_tool(root: Path, argv: list[str], ok_codes: tuple[int, ...] = (0,)) -> Fact:
    """Stdout of a host tool. Tools only run against the real root: a fake tree has no tools."""
    source = " ".join(argv)
    if root != REAL_ROOT:
        return unknown(f"not run: facts root is {root}, not /", source)
    exe = shutil.which(argv[0])
    if exe is None:
        return unknown(f"tool absent: {argv[0]} not on PATH", source)
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return unknown(f"{argv[0]} did not answer within {TOOL_TIMEOUT_S:g} s", source)
    except OSError as err:
        return unknown(f"{argv[0]} could not run: {err.strerror or err}", source)
    if done.returncode not in ok_codes:
        detail = (done.stderr or done.stdout).strip().splitlines()
        return unknown(
            f"{argv[0]} exited {done.returncode}" + (f": {detail[0]}" if detail else ""), source
        )
    return known(done.stdout.strip(), source)


def to_plain(obj: Any) -> Any:
    """JSON-ready form of nested dataclasses, Facts, lists and dicts."""
    if isinstance(obj, Fact):
        return obj.to_dict()
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj

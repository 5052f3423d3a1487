"""The fleet's hosts file: TOML validated by `hosts.schema.json`, resolved into `Host`s.

Errors name the file, the line and the field (`hosts.toml:7: hosts.gpu-a.port: ...`).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_PATH = Path(__file__).with_name("hosts.schema.json")
DEFAULT_DIR = ".autotune-fleet"
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


class InventoryError(Exception):
    """A hosts file that cannot be used; `errors` holds one line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Host:
    """One host as the fleet commands use it, with [defaults] already applied."""

    name: str
    host: str
    port: int = 22
    user: str | None = None
    key: Path | None = None
    tags: tuple[str, ...] = ()
    dir: str = DEFAULT_DIR
    install: str = "auto"
    uv: str | None = None
    uv_offline: bool = False
    device: str = "auto"
    env: dict[str, str] = field(default_factory=dict, hash=False)
    connect_timeout: float | None = None
    command_timeout: float | None = None
    line: int = 0

    @property
    def address(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"{who}{self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "tags": list(self.tags),
            "dir": self.dir,
            "install": self.install,
            "device": self.device,
        }


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: list[Host]
    known_hosts: Path | None = None


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def load_inventory(path: Path) -> Inventory:
    """Read, validate and resolve a hosts file, or raise InventoryError naming line and field."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InventoryError([f"{path}: cannot read the hosts file: {exc.strerror}"]) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError([f"{path}: not valid TOML: {exc}"]) from exc
    lines = key_lines(text)
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(
        (_describe(err, lines) for err in validator.iter_errors(data)), key=lambda e: e[0]
    )
    if errors:
        raise InventoryError([f"{path}:{line}: {message}" for line, message in errors])
    base = path.parent
    defaults = data.get("defaults", {})
    hosts = [
        _host(name, {**defaults, **entry}, base, lines.get(("hosts", name), 0))
        for name, entry in data["hosts"].items()
    ]
    missing = [
        f"{path}:{_line(where, lines)}: {_dotted(where)}: key file {h.key} does not exist"
        for h in hosts
        if h.key is not None and not h.key.is_file()
        for where in [
            ("hosts", h.name, "key") if "key" in data["hosts"][h.name] else ("defaults", "key")
        ]
    ]
    if missing:
        raise InventoryError(missing)
    known = data.get("known_hosts")
    return Inventory(path, hosts, _local_path(known, base) if known else None)


def select_hosts(inventory: Inventory, limits: tuple[str, ...]) -> list[Host]:
    """Hosts whose name or one of whose tags is in `limits` (all hosts when it is empty)."""
    if not limits:
        return list(inventory.hosts)
    chosen = [h for h in inventory.hosts if h.name in limits or set(h.tags) & set(limits)]
    if not chosen:
        tags = sorted({t for h in inventory.hosts for t in h.tags})
        raise InventoryError(
            [
                f"{inventory.path}: no host has the name or tag {', '.join(limits)} "
                f"(tags: {', '.join(tags) or 'none'}; names: "
                f"{', '.join(h.name for h in inventory.hosts)})"
            ]
        )
    return chosen


def _host(name: str, entry: dict[str, Any], base: Path, line: int) -> Host:
    return Host(
        name=name,
        host=entry["host"],
        port=entry.get("port", 22),
        user=entry.get("user"),
        key=_local_path(entry["key"], base) if "key" in entry else None,
        tags=tuple(entry.get("tags", ())),
        dir=_remote_dir(entry.get("dir", DEFAULT_DIR)),
        install=entry.get("install", "auto"),
        uv=entry.get("uv"),
        uv_offline=entry.get("uv_offline", False),
        device=entry.get("device", "auto"),
        env=dict(entry.get("env", {})),
        connect_timeout=entry.get("connect_timeout"),
        command_timeout=entry.get("command_timeout"),
        line=line,
    )


def _local_path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _remote_dir(value: str) -> str:
    # Remote commands are quoted, so `~` would not expand there: a path under the login
    # directory is written relative to it instead (ssh starts commands in that directory).
    if value == "~":
        return "."
    return value[2:] if value.startswith("~/") else value


def _describe(err: jsonschema.ValidationError, lines: dict[tuple, int]) -> tuple[int, str]:
    path = tuple(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        if extra and allowed:
            where = (*path, extra[0])
            return _line(where, lines), (
                f"{_dotted(where)}: unknown field (allowed: {', '.join(sorted(allowed))})"
            )
    if "propertyNames" in err.schema_path:
        where = (*path, err.instance)
        return _line(where, lines), f"{_dotted(where)}: invalid name: {err.message}"
    if err.validator == "required":
        return _line(path, lines), f"{_dotted(path) or 'top level'}: {err.message}"
    return _line(path, lines), f"{_dotted(path) or 'top level'}: {err.message}"


def _line(path: tuple, lines: dict[tuple, int]) -> int:
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return 1


def _dotted(path: tuple) -> str:
    return ".".join(
        str(p) if re.fullmatch(r"[A-Za-z0-9_-]+", str(p)) else json.dumps(str(p)) for p in path
    )


_HEADER = re.compile(r"^\s*(\[\[?)\s*(.+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_PART = re.compile(r"""\s*([A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')\s*(?:\.|$)""")


def key_lines(text: str) -> dict[tuple, int]:
    """Line (1-based) of each table header and key in TOML `text`, by key path."""
    lines: dict[tuple, int] = {}
    table: tuple = ()
    arrays: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            table = _split_key(header.group(2))
            if header.group(1) == "[[":
                arrays[table] = arrays.get(table, -1) + 1
                table = (*table, arrays[table])
            lines.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key:
            path = (*table, *_split_key(key.group(1)))
            for depth in range(len(table) + 1, len(path) + 1):
                lines.setdefault(path[:depth], number)
    return lines


def _split_key(text: str) -> tuple[str, ...]:
    parts = []
    for match in _PART.finditer(text):
        part = match.group(1)
        if part[0] in "\"'":
            part = json.loads(part) if part[0] == '"' else part[1:-1]
        parts.append(part)
    return tuple(parts)

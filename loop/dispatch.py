"""Dispatch tables: per shape, the winning candidate and params, or the best peer where nothing
beat it; `load` gives model code a function that picks by shape at run time."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def build_dispatch(task_name: str, bucket_key: str | None, rows: list[dict]) -> dict:
    """rows: [{"shape", "dims", "source": candidate|peer, "name", "params", "speedup"}]."""
    return {"task": task_name, "bucket_key": bucket_key, "entries": rows}


def save_dispatch(table: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=2, sort_keys=True))


def load_dispatch(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def choose(table: dict, **dims) -> dict:
    """The entry for these dims: exact match on every dim but the bucket key; on the bucket key,
    the largest bucket not above the value (or the smallest bucket)."""
    key = table.get("bucket_key")
    fixed = {k: v for k, v in dims.items() if k != key}
    matching = [e for e in table["entries"] if all(e["dims"].get(k) == v for k, v in fixed.items())]
    if not matching:
        raise LookupError(f"no dispatch entry for {fixed} in {table['task']}")
    if key is None or key not in dims:
        return matching[0]
    ordered = sorted(matching, key=lambda e: e["dims"][key])
    below = [e for e in ordered if e["dims"][key] <= dims[key]]
    return below[-1] if below else ordered[0]


@dataclass(frozen=True)
class Choice:
    """What to run for one call: a tuned candidate with its params, or a peer."""

    source: str  # candidate or peer
    name: str
    params: dict
    shape: str
    commit: str = ""


def load(path: Path | str) -> Callable[..., Choice]:
    """The dispatch table at `path` as a function of the call's dims, for model code:

    pick = load("dispatch-rmsnorm.json")
    choice = pick(tokens=x.shape[0], hidden=x.shape[1])  # Choice(source, name, params, ...)
    """
    table = load_dispatch(Path(path))
    if not table.get("entries"):
        raise LookupError(f"{path}: the dispatch table has no entries")

    def pick(**dims) -> Choice:
        e = choose(table, **dims)
        return Choice(
            e["source"], e["name"], dict(e.get("params") or {}), e["shape"], e.get("commit", "")
        )

    return pick

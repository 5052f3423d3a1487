"""Dispatch tables: per shape, the winning candidate and params, or the best peer where nothing
beat it; `load` gives model code a function that picks by shape at run time."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from baselines.stats import decide, ratio_interval, summarize


def contest(peer_blocks: list[float], cand_blocks: list[float], min_effect: float):
    """The rule that gives a shape to the candidate or the best peer (the loop's final
    comparison): the ratio interval of peer / candidate block times, as a dict, and the winner,
    "candidate" only where the interval is decided `faster` at `min_effect`, else "peer"."""
    interval = ratio_interval(peer_blocks, cand_blocks)
    speedup = {"ratio": interval.ratio, "ci_low": interval.ci_low, "ci_high": interval.ci_high}
    return speedup, "candidate" if decide(interval, min_effect) == "faster" else "peer"


def source_sha256(path: Path) -> str:
    """Hex SHA-256 of a candidate file's bytes: what `autotune bench --json` records as
    `candidate_sha256`, so a table built later can tell whether the file still is what ran."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_changed(doc: dict, current: Path) -> bool | None:
    """Whether the candidate file `current` differs from the one the bench document `doc` timed
    (None: the document predates the recorded digest)."""
    recorded = doc.get("candidate_sha256")
    return None if not recorded else recorded != source_sha256(current)


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


# ------------------------------------------------------------------ tables from bench output


def is_bench_doc(doc: object) -> bool:
    """Whether `doc` looks like what `autotune bench TASK CANDIDATE --json` writes."""
    return isinstance(doc, dict) and all(
        k in doc for k in ("task", "verdict", "shapes", "candidate", "peer_verdicts")
    )


def _blocks(verdict: dict, shape: str, where: str) -> list[float]:
    """The verdict's timed blocks on `shape` ([] when untimed or dropped)."""
    shapes = verdict.get("shapes")
    if not isinstance(shapes, dict):
        raise ValueError(f"{where}: 'shapes' is not an object")
    result = shapes.get(shape)
    if not result or result.get("dropped"):
        return []
    blocks = result.get("blocks_s") or []
    if not isinstance(blocks, list) or not all(isinstance(b, int | float) for b in blocks):
        raise ValueError(f"{where}: 'shapes.{shape}.blocks_s' is not a list of seconds")
    return [float(b) for b in blocks]


def from_benches(
    task, docs: list[dict], min_effect: float = 0.005, device: str = "cuda"
) -> tuple[dict, list[dict]]:
    """The dispatch table for `task` (a loop.tasks.Task) from `autotune bench --json` documents,
    and one report row per shape. Only accepted documents of this task count. Per shape timed by
    some document, the candidate with the lowest median block time wins the shape's slot; it
    then meets the fastest accepted peer of the same document (the same interleaved run) with
    the rule of the loop's final comparison: the candidate is kept only when the ratio interval
    is decided `faster` at `min_effect`, else the peer is; with no peer timed, the candidate.
    Documents of another device kind are left out. A table names a candidate by file name, which
    model code loads from the task's folder: a candidate benched from anywhere else is an
    error. Each row says whether that file has changed since the bench (`file_changed`: None
    where the document recorded no digest)."""
    kind = device.split(":")[0]
    mine = [
        d
        for d in docs
        if d.get("task") == task.name
        and d.get("verdict") == "accepted"
        and str(d.get("device", kind)).split(":")[0] == kind
    ]
    for i, doc in enumerate(mine):
        where = f"bench document {i} ({task.name})"
        if not isinstance(doc.get("peer_verdicts"), list):
            raise ValueError(f"{where}: 'peer_verdicts' is missing or not a list")
        if not doc.get("candidate"):
            raise ValueError(f"{where}: 'candidate' (the candidate's path) is missing")
        path = Path(str(doc["candidate"]))
        # the task's folder of some checkout (benches run from a clone on the GPU machine)
        shipped = path.parts[-3:-1] == task.folder.parts[-2:]
        if not shipped or not (task.folder / path.name).is_file():
            raise ValueError(
                f"{where}: candidate {str(path)!r} is not a file of the task's folder "
                f"{task.folder}; a dispatch table can only name those"
            )
    entries, rows = [], []
    for shape in task.shapes(kind):
        timed = []
        for i, doc in enumerate(mine):
            blocks = _blocks(doc, shape.name, f"bench document {i} ({task.name})")
            if blocks:
                timed.append((statistics.median(blocks), i, blocks, doc))
        if not timed:
            continue
        median, i, cand, doc = min(timed, key=lambda t: t[:2])
        where = f"bench document {i} ({task.name})"
        peers = {}
        for p in doc["peer_verdicts"]:
            if p.get("verdict") == "accepted":
                blocks = _blocks(p, shape.name, f"{where}, peer {p.get('label')!r}")
                if blocks:
                    peers[str(p.get("label"))] = blocks
        name = Path(str(doc["candidate"])).name
        params = dict(doc.get("params") or {})
        peer_times = {label: summarize(blocks) for label, blocks in peers.items()}
        winner, best, speedup = "candidate", None, None
        if peers:
            best = min(peer_times, key=lambda label: peer_times[label].median)
            speedup, winner = contest(peers[best], cand, min_effect)
        entries.append(
            {
                "shape": shape.name,
                "dims": shape.dims,
                "source": winner,
                "name": name if winner == "candidate" else best,
                "params": params if winner == "candidate" else {},
                "commit": "",
                "speedup": speedup,
            }
        )
        s = summarize(cand)
        moved = task.bytes_moved(shape)
        copy = (doc.get("ceilings") or {}).get("copy_bytes_per_s")
        rows.append(
            {
                "task": task.name,
                "shape": shape.name,
                "candidate": name,
                "params": params,
                "median_us": s.median * 1e6,
                "ci_low_us": s.ci_low * 1e6,
                "ci_high_us": s.ci_high * 1e6,
                "peers_us": {k: t.median * 1e6 for k, t in peer_times.items()},
                "peers_ci_us": {
                    k: [t.ci_low * 1e6, t.ci_high * 1e6] for k, t in peer_times.items()
                },
                "best_peer": best,
                "speedup": speedup,
                "copy_fraction": moved / median / copy if moved > 0 and copy else None,
                "tflops": task.flops(shape) / median / 1e12,
                "winner": winner,
                "file_changed": file_changed(doc, task.folder / name),
            }
        )
    return build_dispatch(task.name, task.bucket_key, entries), rows

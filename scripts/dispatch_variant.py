"""A copy of a folder of dispatch tables with some entries changed by hand, for an A/B of one
op's choice inside a decoder block (`scripts/bench_e2e_block.py --dispatch-dir`), where a per-op
bench cannot see what the op's neighbours overlap with it (programmatic dependent launch).

Each changed entry is marked `"edited": true` and loses its measured speedup, so such a table
is never taken for one built from benches. The other tables are copied unchanged; the source's
Markdown is not (it describes the tables as benched): VARIANT.txt says what was changed.

    uv run python scripts/dispatch_variant.py SRC_DIR DST_DIR \
        --set TASK SHAPE NAME PARAMS_JSON [--set ...]

NAME is a candidate file of the task's folder (its PARAMS_JSON a JSON object) or one of the
task's peers (PARAMS_JSON '{}'). SHAPE is an entry's shape, or one of the task's GPU shapes that
the table has no entry for, which is then added (edited like the others). A task SRC_DIR has no
table for gets a new one holding only the entries set.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loop.dispatch import build_dispatch, load_dispatch, save_dispatch  # noqa: E402
from loop.tasks import TaskError, load_task  # noqa: E402


def edit_entry(
    table: dict, shape: str, name: str, params: dict, peers: list[str], dims: dict | None = None
) -> None:
    """Point `table`'s entry for `shape` at candidate file `name` with `params`, or at peer
    `name`; where the table has no entry for `shape`, add one with the task shape's `dims`
    (None: `shape` is not one of the task's). Raises ValueError naming what is wrong."""
    entry = next((e for e in table["entries"] if e["shape"] == shape), None)
    if entry is None and dims is None:
        known = ", ".join(e["shape"] for e in table["entries"])
        raise ValueError(
            f"{table['task']}: no entry for shape {shape!r} (entries: {known}), nor is it one of"
            " the task's shapes"
        )
    if entry is None:
        entry = {"shape": shape, "dims": dict(dims)}
        table["entries"].append(entry)
    if name.endswith(".py"):
        source = "candidate"
    elif name in peers:
        source = "peer"
        if params:
            raise ValueError(f"{table['task']}: peer {name!r} takes no params, got {params}")
    else:
        raise ValueError(f"{table['task']}: {name!r} is neither a .py candidate nor a peer {peers}")
    entry.update(source=source, name=name, params=params, commit="", speedup=None, edited=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="folder of dispatch-<task>.json")
    parser.add_argument("dst", type=Path, help="new folder (must not exist)")
    parser.add_argument(
        "--set",
        nargs=4,
        action="append",
        required=True,
        metavar=("TASK", "SHAPE", "NAME", "PARAMS_JSON"),
        help="the entry to change",
    )
    args = parser.parse_args(argv)
    if args.dst.exists():
        print(f"{args.dst}: already exists; give a new folder", file=sys.stderr)
        return 2
    tables: dict[str, dict] = {}
    try:
        for task_name, shape, name, params_json in args.set:
            path = args.src / f"dispatch-{task_name}.json"
            try:
                params = json.loads(params_json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"PARAMS_JSON {params_json!r}: not JSON ({exc})") from exc
            if not isinstance(params, dict):
                raise ValueError(f"PARAMS_JSON {params_json!r}: expected a JSON object")
            task = load_task(task_name)
            if name.endswith(".py") and not (task.folder / name).is_file():
                raise ValueError(f"{task_name}: no candidate file {name} in {task.folder}")
            if task_name not in tables:
                tables[task_name] = (
                    load_dispatch(path)
                    if path.is_file()
                    else build_dispatch(task_name, task.bucket_key, [])
                )
            table = tables[task_name]
            dims = next((s.dims for s in task.shapes("cuda") if s.name == shape), None)
            edit_entry(table, shape, name, params, list(task.peers), dims)
    except (ValueError, TaskError) as exc:
        print(f"dispatch_variant: {exc}", file=sys.stderr)
        return 2
    args.dst.mkdir(parents=True)
    for path in sorted(args.src.glob("dispatch-*.json")):
        shutil.copy2(path, args.dst / path.name)
    for task_name, table in tables.items():
        save_dispatch(table, args.dst / f"dispatch-{task_name}.json")
    changed = "\n".join(f"{t} {s} -> {n} {p}" for t, s, n, p in args.set)
    (args.dst / "VARIANT.txt").write_text(f"{args.src}, edited by hand:\n{changed}\n")
    print(f"wrote {args.dst}:\n{changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

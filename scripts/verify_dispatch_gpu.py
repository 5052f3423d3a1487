"""Verify every candidate entry of a folder of dispatch tables with the evaluator, as the loop
would before keeping it: the entry's candidate file with its parameters, at the entry's shape, on
fresh secret seeds, with the task's ragged twins and the CUDA-graph capture check. A table built
before a check was added (a new input, a ragged twin) is re-checked here against it, so that a
tuned choice that the stricter evaluator rejects is found before a block or a user runs it.

The candidate file is found as the decoder blocks find it (loop.blocks.candidate_source: the
run's workspace copy at the entry's commit, else the task folder's). Entries of one task that
share a candidate, its commit and its parameters are verified in one evaluator call
over their shapes; calls run a few at a time (verification only, nothing is timed).

    uv run python scripts/verify_dispatch_gpu.py TABLES_DIR [--seeds 2] [--json OUT]
        [--tasks a,b] [--jobs 3]

Prints one line per group and a summary; exits 1 if any group is rejected (a rejection stops
its group at the first failing shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loop.blocks import candidate_source  # noqa: E402
from loop.dispatch import load_dispatch  # noqa: E402
from loop.evaluator import CandidateSpec, evaluate  # noqa: E402
from loop.tasks import load_task  # noqa: E402


@dataclass
class Group:
    """The candidate entries of one table that share a candidate file and its parameters."""

    task: str
    name: str
    source: Path  # the file verified: the workspace copy at the entry's commit, or the task's
    params: dict
    shapes: list[str]


@dataclass
class GroupVerdict:
    group: Group
    accepted: bool
    reasons: list[str]  # a rejection's reasons; the shapes after the first failing one are not run
    seconds: float


def candidate_groups(folder: Path, tasks: set[str]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for path in sorted(folder.glob("dispatch-*.json")):
        table = load_dispatch(path)
        if tasks and table["task"] not in tasks:
            continue
        task = load_task(table["task"])
        for entry in table["entries"]:
            if entry["source"] != "candidate":
                continue
            commit = entry.get("commit", "")
            params = json.dumps(entry["params"], sort_keys=True)
            key = (table["task"], entry["name"], commit, params)
            if key not in groups:
                source, _ = candidate_source(folder, task, commit, entry["name"])
                groups[key] = Group(table["task"], entry["name"], source, entry["params"], [])
            groups[key].shapes.append(entry["shape"])
    return list(groups.values())


def verify_group(group: Group, seeds: int) -> GroupVerdict:
    task = load_task(group.task)
    spec = CandidateSpec(group.source, group.params, group.name)
    started = time.monotonic()
    verdict = evaluate(task, [spec], "cuda", shapes=group.shapes, seeds=seeds).by_label(group.name)
    reasons = [f"{r.code}: {r.message}" for r in verdict.reasons]
    return GroupVerdict(group, verdict.accepted, reasons, time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", type=Path, help="Folder of dispatch-<task>.json tables.")
    parser.add_argument("--seeds", type=int, default=2, help="Fresh secret seeds a shape [2].")
    parser.add_argument("--tasks", default="", help="Comma-separated task names [all].")
    parser.add_argument("--jobs", type=int, default=3, help="Evaluator calls at once [3].")
    parser.add_argument("--json", type=Path, help="Write every entry's verdict here.")
    args = parser.parse_args()
    groups = candidate_groups(args.tables, {t for t in args.tasks.split(",") if t})
    if not groups:
        print(f"no candidate entry in {args.tables}", file=sys.stderr)
        return 2
    print(
        f"{sum(len(g.shapes) for g in groups)} candidate entries in {len(groups)} groups",
        flush=True,
    )
    results: list[GroupVerdict] = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(verify_group, g, args.seeds) for g in groups]
        for future in as_completed(futures):  # printed as they end: a run cut short says which
            v = future.result()
            word = "accepted" if v.accepted else "REJECTED " + "; ".join(v.reasons)[:400]
            params = json.dumps(v.group.params, sort_keys=True)
            shapes = ",".join(v.group.shapes)
            print(
                f"{v.group.task} {v.group.name} {params} [{shapes}]: {word} ({v.seconds:.0f} s)",
                flush=True,
            )
            results.append(v)
    rejected = [v for v in results if not v.accepted]
    print(f"{len(results) - len(rejected)} of {len(results)} groups accepted")
    if args.json:
        args.json.write_text(json.dumps([asdict(v) for v in results], indent=1, default=str) + "\n")
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())

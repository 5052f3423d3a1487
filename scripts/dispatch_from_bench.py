"""Dispatch tables from `autotune bench TASK CANDIDATE --json` output, without `autotune run`:
per task, each shape goes to the fastest benched candidate where it beats the fastest peer of its
own run (the loop's final-comparison rule), else to that peer. Writes OUT_DIR/dispatch-<task>.json
per task (what `scripts/bench_e2e_block.py --dispatch-dir OUT_DIR` reads) and prints a Markdown
table per task. Files that are empty or not bench JSON (a bench that timed out, a sweep) are
skipped with a note.

    uv run python scripts/dispatch_from_bench.py OUT_DIR BENCH_JSON_OR_DIR... \
        [--min-effect 0.005] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loop.dispatch import from_benches, is_bench_doc, save_dispatch  # noqa: E402
from loop.tasks import TaskError, load_task  # noqa: E402


def read_docs(paths: list[Path]) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The bench documents in `paths` (files, or folders of *.json), each with its file, and a
    note per skipped file."""
    docs, notes = [], []
    files = []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    for file in files:
        try:
            doc = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            notes.append(f"skipped {file}: not JSON ({exc})")
            continue
        if not is_bench_doc(doc):
            notes.append(f"skipped {file}: not `autotune bench --json` output")
            continue
        docs.append((file, doc))
    return docs, notes


def format_params(params: dict) -> str:
    return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in params.items())


def _percent(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    return f"{100 * fraction:.1f}%" if fraction < 0.1 else f"{100 * fraction:.0f}%"


def _peer(row: dict, peer: str) -> str:
    if peer not in row["peers_us"]:
        return "-"
    low, high = row["peers_ci_us"][peer]
    return f"{row['peers_us'][peer]:.2f} [{low:.2f}, {high:.2f}]"


def markdown(task: str, rows: list[dict]) -> str:
    """The report of one task: a row per shape, then which shapes the peers keep."""
    peers = sorted({p for r in rows for p in r["peers_us"]})
    head = ["shape", "candidate", "candidate us [95% CI]", *(f"{p} us [95% CI]" for p in peers)]
    head += ["best peer", "speedup [95% CI]", "% copy BW", "TFLOP/s", "winner"]
    lines = [f"### {task}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        sp = r["speedup"]
        cells = [
            r["shape"],
            f"{r['candidate']} {format_params(r['params'])}".strip(),
            f"{r['median_us']:.2f} [{r['ci_low_us']:.2f}, {r['ci_high_us']:.2f}]",
            *(_peer(r, p) for p in peers),
            r["best_peer"] or "-",
            f"{sp['ratio']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]" if sp else "-",
            _percent(r["copy_fraction"]),
            f"{r['tflops']:.1f}" if r["tflops"] else "-",
            r["winner"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    kept = [f"{r['shape']} ({r['best_peer']})" for r in rows if r["winner"] == "peer"]
    lines += ["", "The peer keeps: " + (", ".join(kept) if kept else "no shape") + "."]
    changed = [f"{r['shape']} ({r['candidate']})" for r in rows if r.get("file_changed")]
    if changed:
        lines += [
            "",
            "Timed on an earlier version of the candidate file, changed since the bench: "
            + ", ".join(changed)
            + ".",
        ]
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="where dispatch-<task>.json files go")
    parser.add_argument("benches", type=Path, nargs="+", help="bench JSON files or folders")
    parser.add_argument("--min-effect", type=float, default=0.005)
    parser.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.benches if not p.exists()]
    if missing:
        print(f"error: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.min_effect < 0:
        print(f"error: --min-effect must be >= 0, got {args.min_effect}", file=sys.stderr)
        return 2
    docs, notes = read_docs(args.benches)
    for note in notes:
        print(note)
    by_task: dict[str, list[dict]] = {}
    for _, doc in docs:
        by_task.setdefault(str(doc["task"]), []).append(doc)
    reports = []
    for name in sorted(by_task):
        try:
            task = load_task(name)
            table, rows = from_benches(task, by_task[name], args.min_effect)
        except (TaskError, ValueError) as exc:
            print(f"skipped task {name}: {exc}")
            continue
        if not table["entries"]:
            print(f"skipped task {name}: no accepted bench timed any of its shapes")
            continue
        path = args.out_dir / f"dispatch-{name}.json"
        save_dispatch(table, path)
        print(f"wrote {path}")
        reports.append(markdown(name, rows))
    if not reports:
        print("error: no dispatch table written (no accepted bench documents)", file=sys.stderr)
        return 1
    text = "\n".join(reports)
    print()
    print(text)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

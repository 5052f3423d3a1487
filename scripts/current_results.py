"""The kernel library's results as they stand, on one page: docs/benchmarks/CURRENT.md, built
from what docs/benchmarks/current.json names, and from nothing typed by hand.

current.json names, per task, the dispatch table in force (`per_op`: a dispatch-<task>.json
under docs/benchmarks/), the tasks that have none and why (`not_tabled`), the decoder blocks'
tables in force (`block_tables`, a folder) and the decoder-block runs to show (`blocks`: e2e JSON
files of scripts/bench_e2e_block.py). For every entry of every table the page shows the bench
that chose it: the committed `autotune bench --json` document whose winner on that shape has
the entry's speedup, with its candidate and peer times, 95 % intervals and % of copy, as
scripts/dispatch_from_bench.py prints them, and the file it came from. An entry that no
committed bench, or more than one, explains is an error, as is one without a speedup (no peer
timed, or edited by hand), which no bench can be told apart by; a bench whose candidate file has
since been removed is not read. The block tables' entries that differ from the per-op tables are
listed beside the decoder-block runs.

    uv run python scripts/current_results.py           # rewrite CURRENT.md
    uv run python scripts/current_results.py --check   # exit 1 if CURRENT.md is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from dispatch_from_bench import format_params, markdown, read_docs  # noqa: E402

from loop.dispatch import from_benches, load_dispatch  # noqa: E402
from loop.tasks import load_task  # noqa: E402

BENCHMARKS = Path("docs", "benchmarks")  # under the repository's root
MANIFEST = ROOT / BENCHMARKS / "current.json"
PAGE = ROOT / BENCHMARKS / "CURRENT.md"
VARIANTS = ("eager", "compiled", "tuned", "compiled-tuned")


@dataclass(frozen=True)
class Manifest:
    """What the page shows (paths relative to the repository's root)."""

    per_op: dict[str, Path]
    not_tabled: dict[str, str]
    block_tables: Path
    blocks: list[Path]


def load_manifest(path: Path, root: Path = ROOT) -> Manifest:
    """current.json, checked: every path must exist under `root`; errors name the field."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must hold an object")
    expected = {"per_op", "not_tabled", "block_tables", "blocks"}
    if set(raw) != expected:
        raise ValueError(f"{path}: fields must be {sorted(expected)}, got {sorted(raw)}")

    def existing(value: object, field: str, folder: bool = False) -> Path:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{path}: '{field}' must be a path relative to the repository")
        found = root / value
        if not found.resolve().is_relative_to((root / BENCHMARKS).resolve()):
            raise ValueError(f"{path}: '{field}': {value} is not under docs/benchmarks/")
        if not (found.is_dir() if folder else found.is_file()):
            kind = "folder" if folder else "file"
            raise ValueError(f"{path}: '{field}': no such {kind} {value}")
        return Path(value)

    for field in ("per_op", "not_tabled"):
        if not isinstance(raw[field], dict):
            raise ValueError(f"{path}: '{field}' must be an object keyed by task")
    if not isinstance(raw["blocks"], list):
        raise ValueError(f"{path}: 'blocks' must be a list of e2e JSON files")
    both = sorted(set(raw["per_op"]) & set(raw["not_tabled"]))
    if both:
        raise ValueError(f"{path}: tasks both in 'per_op' and 'not_tabled': {both}")
    for task, why in raw["not_tabled"].items():
        if not isinstance(why, str) or not why:
            raise ValueError(f"{path}: 'not_tabled.{task}' must say why the task has no table")
    tasks = {p.parent.name for p in (root / "kernels").glob("*/task.py")}
    named = set(raw["per_op"]) | set(raw["not_tabled"])
    if named != tasks:
        raise ValueError(
            f"{path}: 'per_op' and 'not_tabled' must name every task under kernels/ once: "
            f"missing {sorted(tasks - named)}, unknown {sorted(named - tasks)}"
        )
    return Manifest(
        per_op={t: existing(p, f"per_op.{t}") for t, p in raw["per_op"].items()},
        not_tabled=dict(raw["not_tabled"]),
        block_tables=existing(raw["block_tables"], "block_tables", folder=True),
        blocks=[existing(p, f"blocks[{i}]") for i, p in enumerate(raw["blocks"])],
    )


def _explains(entry: dict, row: dict) -> bool:
    """Whether a bench's row for the entry's shape is the one that chose the entry: the same
    candidate (a candidate entry) or best peer (a peer entry), and the same speedup. Which of
    the two won is the table's say (its own threshold), not the row's."""
    if row["shape"] != entry["shape"] or row["speedup"] is None:
        return False
    if entry["source"] == "candidate":
        if (row["candidate"], row["params"]) != (entry["name"], entry.get("params") or {}):
            return False
    elif row["best_peer"] != entry["name"]:
        return False
    return row["speedup"]["ratio"] == entry["speedup"]["ratio"]


def chosen_by(task_name: str, entry: dict, docs: list[tuple[Path, dict]]) -> tuple[dict, Path]:
    """The bench row that chose a table entry (its winner the entry's source), and its file:
    exactly one must."""
    if not entry.get("speedup"):
        raise ValueError(
            f"{task_name} {entry['shape']}: the entry has no speedup (no peer timed, or edited by "
            "hand), so no bench can be told to have chosen it"
        )
    task = load_task(task_name)
    found = []
    for file, doc in docs:
        if doc.get("task") != task_name or entry["shape"] not in (doc.get("shapes") or {}):
            continue
        try:
            _, rows = from_benches(task, [doc])
        except ValueError:  # a candidate file removed since: it chose no entry in force
            continue
        found += [(row, file) for row in rows if _explains(entry, row)]
    if len(found) != 1:
        where = ", ".join(str(f) for _, f in found) or "none"
        raise ValueError(
            f"{task_name} {entry['shape']}: {len(found)} committed benches chose its entry "
            f"({entry['source']} {entry['name']}), one must ({where})"
        )
    row, file = found[0]
    return {**row, "winner": entry["source"]}, file


def per_op_section(task_name: str, table: Path, docs: list[tuple[Path, dict]], root: Path) -> str:
    """A task's table in force, each row as timed by the bench that chose it."""
    loaded = load_dispatch(root / table)
    if loaded.get("task") != task_name:
        raise ValueError(f"per_op.{task_name}: {table} is the table of {loaded.get('task')!r}")
    chosen = [chosen_by(task_name, e, docs) for e in loaded["entries"]]
    timed = [f"- {row['shape']}: {_link(file, root)}" for row, file in chosen]
    return "\n".join(
        [
            markdown(task_name, [row for row, _ in chosen]),
            f"Table: {_link(root / table, root)}. Timed in:",
            "",
            *timed,
            "",
        ]
    )


def _link(path: Path, root: Path) -> str:
    """A Markdown link to `path`, relative to the page's folder."""
    rel = path.relative_to(root / BENCHMARKS)
    return f"[{rel}]({rel})"


def _us(times: dict, variant: str) -> str:
    return f"{times[variant]['median'] * 1e6:.1f}" if variant in times else "-"


def _ratio(row: dict, key: str) -> str:
    r = row.get(key)
    return f"{r['ratio']:.3f}x [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r else "-"


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _is_current(dispatch_dir: str, current: Path) -> bool:
    return Path(dispatch_dir).parts[-len(current.parts) :] == current.parts


def _tables(dispatch_dir: str | None, current: Path) -> str:
    if not dispatch_dir:
        return "-"
    if _is_current(dispatch_dir, current):
        return "in force"
    if dispatch_dir.startswith("/tmp/"):
        return "a copy made in the call (its CALL.txt)"
    return str(Path(dispatch_dir)).removeprefix("docs/benchmarks/")


def block_rows(e2e: Path, current: Path, root: Path) -> list[str]:
    """One Markdown row per decoder block of an e2e run: its four variants' times, the tuned
    blocks against the compiled one, the decode stream's % of copy, the host's bandwidths. A
    run that also timed the tables in force as a variant (`--also NAME=DIR`) gets a second row
    for them: their tuned blocks' times and % of copy, and their ratio to the run's own tables
    in place of the ratios to the compiled block (which the run does not pair with them)."""
    doc = json.loads((root / e2e).read_text())
    host = (
        f"{doc['copy_bytes_per_s'] / 1e12:.2f} / {doc['read_bytes_per_s'] / 1e12:.2f}"
        if doc.get("read_bytes_per_s")
        else f"{doc['copy_bytes_per_s'] / 1e12:.2f} / -"
    )
    base = doc.get("dispatch_dir")
    lines = []
    for row in doc["results"]:
        times = row["times_s"]
        pct = row.get("stream_pct_of_copy") or {}
        size = f"{row['mode']} b{row['batch']} {_tokens(row['length'])}"
        if row.get("tokens"):  # a chunked prefill: the prompt's last tokens onto its cache
            size += f", its last {_tokens(row['tokens'])}"
        runs = [("", _ratio(row, "tuned_vs_compiled"), _ratio(row, "compiled_tuned_vs_compiled"))]
        runs += [
            (
                f":{name}",
                f"{_ratio(ratios, 'tuned')} vs the run's tables",
                f"{_ratio(ratios, 'compiled_tuned')} vs the run's tables",
            )
            for name, ratios in (row.get("also") or {}).items()
            if _is_current((doc.get("also") or {}).get(name, ""), current)
        ]
        for suffix, tuned_ratio, compiled_tuned_ratio in runs:
            names = [v if v in ("eager", "compiled") else v + suffix for v in VARIANTS]
            wrong = [v for v, ok in row.get("correct", {}).items() if not ok and v in names]
            tuned_pct = [pct[v] for v in names[2:] if v in pct]
            cells = [
                row["kind"] + (f" (wrong: {', '.join(wrong)})" if wrong else ""),
                size,
                str(row.get("layers") or 1),
                *(_us(times, v) for v in names),
                tuned_ratio,
                compiled_tuned_ratio,
                " / ".join(f"{p:.1f}" for p in tuned_pct) or "-",
                host,
                _tables(base, current) if not suffix else f"in force (as `--also {suffix[1:]}`)",
                _link(root / e2e, root),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _choice(entry: dict | None) -> str:
    if entry is None:
        return "no entry"
    return f"{entry['source']} {entry['name']} {format_params(entry.get('params') or {})}".strip()


def block_table_differences(manifest: Manifest, root: Path = ROOT) -> list[str]:
    """One line per shape where the block tables in force choose otherwise than the per-op
    table (A/Bs inside the block can overrule a per-op bench; a hand-edited entry says so)."""
    lines = []
    for file in sorted((root / manifest.block_tables).glob("dispatch-*.json")):
        block = load_dispatch(file)
        task = block["task"]
        per_op = {}
        if task in manifest.per_op:
            per_op = {e["shape"]: e for e in load_dispatch(root / manifest.per_op[task])["entries"]}
        ours = {e["shape"]: e for e in block["entries"]}
        for shape in sorted(set(ours) | set(per_op)):
            mine, theirs = ours.get(shape), per_op.get(shape)
            keys = ("source", "name", "params")
            if mine and theirs and all(mine.get(k) == theirs.get(k) for k in keys):
                continue
            how = " (edited by hand)" if mine and mine.get("edited") else ""
            lines.append(
                f"- {task} {shape}: the block tables run {_choice(mine)}{how}; the per-op "
                f"table, {_choice(theirs)}"
            )
    return lines


BLOCK_HEAD = [
    "block",
    "size",
    "layers",
    *(f"{v} us" for v in VARIANTS),
    "tuned vs compiled [95% CI]",
    "compiled-tuned vs compiled [95% CI]",
    "stream % of copy (tuned / compiled-tuned)",
    "host copy / read TB/s",
    "tables",
    "run",
]


def render(manifest: Manifest, root: Path = ROOT) -> str:
    """The whole page."""
    docs, _ = read_docs(sorted((root / BENCHMARKS).rglob("*.json")))  # notes: files not benches
    lines = [
        "# The kernel library's results as they stand",
        "",
        "Generated by `scripts/current_results.py` from [current.json](current.json) and the "
        "committed bench and e2e JSON; do not edit by hand. Each write-up under this folder says "
        "how its numbers were taken; [README.md](README.md) indexes them.",
        "",
        "## Per op: the dispatch tables in force",
        "",
        "Each row is the bench that chose the table's entry for that shape (the candidate's and "
        "the peers' times in one interleaved run, 95 % intervals; the speedup is against the "
        "fastest peer of that run; % copy BW against the copy bandwidth measured in that run).",
        "",
    ]
    for task in sorted(manifest.per_op):
        lines.append(per_op_section(task, manifest.per_op[task], docs, root))
    if manifest.not_tabled:
        lines += ["Tasks without a per-op table:", ""]
        lines += [f"- {task}: {why}" for task, why in sorted(manifest.not_tabled.items())]
        lines.append("")
    lines += [
        "## Decoder blocks",
        "",
        f"Block tables in force: {_link(root / manifest.block_tables, root)}. Each row is one "
        "block of one run under CUDA graphs: eager, `torch.compile` of it, `tuned` (the eager block with the tables' "
        "winners swapped in) and `compiled-tuned` (`torch.compile` of the tuned block). The "
        "decode target is the weights and KV streamed at 90 % of the run's copy bandwidth. "
        "`tables` says whether the run used the tables in force. A run that timed the tables in "
        "force beside its own (`--also`) has a second row for them, whose ratios are to the "
        "run's own tables (above 1: the tables in force are faster).",
        "",
        "| " + " | ".join(BLOCK_HEAD) + " |",
        "|" + "---|" * len(BLOCK_HEAD),
    ]
    for e2e in manifest.blocks:
        lines += block_rows(e2e, manifest.block_tables, root)
    differences = block_table_differences(manifest, root)
    if differences:
        lines += [
            "",
            "Where the block tables in force choose otherwise than the per-op tables above (an "
            "in-block A/B, a later bench of the block's choice, or a task the blocks do not call; "
            "the tables' VARIANT.txt files and the write-ups say which):",
            "",
            *differences,
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is current")
    args = parser.parse_args(argv)
    try:
        text = render(load_manifest(MANIFEST))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run scripts/current_results.py", file=sys.stderr)
            return 1
        print(f"{PAGE} is current")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

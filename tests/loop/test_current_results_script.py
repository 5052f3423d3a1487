"""scripts/current_results.py: the page of results in force (docs/benchmarks/CURRENT.md) is
built from current.json and the committed benches, each table entry traced to the one bench that
chose it, and bad manifests are rejected with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loop.dispatch import from_benches
from loop.tasks import load_task
from tests.loop.test_dispatch import DECODE, LONG, ROOT, _doc
from tests.source_files import import_file

current = import_file(ROOT / "scripts" / "current_results.py")


def test_the_committed_page_is_current_and_every_entry_is_traced_to_one_bench() -> None:
    manifest = current.load_manifest(current.MANIFEST)
    text = current.render(manifest)
    assert current.PAGE.read_text() == text, "run scripts/current_results.py"
    for task in manifest.per_op:
        assert f"### {task}\n" in text
    assert "### allreduce" not in text and "- allreduce: " in text


def _entries_and_docs(tmp_path: Path) -> tuple[dict, list[tuple[Path, dict]]]:
    doc = _doc(
        {DECODE: 5e-6, LONG: 4e-4},
        {"torch.compile": {DECODE: 8e-6, LONG: 2e-4}},
        {"chunk_rows": 0},
    )
    other = _doc({DECODE: 6e-6}, {"torch.compile": {DECODE: 8e-6}}, {"chunk_rows": 64})
    table, _ = from_benches(load_task("rmsnorm"), [doc])
    return {e["shape"]: e for e in table["entries"]}, [
        (tmp_path / "a.json", doc),
        (tmp_path / "b.json", other),
    ]


def test_an_entry_is_traced_to_the_bench_that_chose_it(tmp_path: Path) -> None:
    entries, docs = _entries_and_docs(tmp_path)
    row, file = current.chosen_by("rmsnorm", entries[DECODE], docs)
    assert file == tmp_path / "a.json" and row["winner"] == "candidate"
    assert row["params"] == {"chunk_rows": 0} and row["median_us"] == pytest.approx(5.0)
    # the peer's entry, from the same bench
    row, file = current.chosen_by("rmsnorm", entries[LONG], docs)
    assert file == tmp_path / "a.json" and row["winner"] == "peer"
    assert row["best_peer"] == "torch.compile"


def test_an_entry_is_traced_whatever_threshold_its_table_was_built_with(tmp_path: Path) -> None:
    """At a 5 % threshold a 3 % faster candidate leaves the shape to the peer; the bench that
    chose it is found, shown with the table's winner."""
    doc = _doc({DECODE: 5.0e-6}, {"torch.compile": {DECODE: 5.15e-6}}, {"chunk_rows": 0})
    table, _ = from_benches(load_task("rmsnorm"), [doc], min_effect=0.05)
    (entry,) = table["entries"]
    assert entry["source"] == "peer" and entry["speedup"]["ratio"] > 1.02
    row, file = current.chosen_by("rmsnorm", entry, [(tmp_path / "a.json", doc)])
    assert file == tmp_path / "a.json" and row["winner"] == "peer"


def test_an_entry_no_bench_or_two_benches_explain_is_an_error(tmp_path: Path) -> None:
    entries, docs = _entries_and_docs(tmp_path)
    moved = {**entries[DECODE], "speedup": {**entries[DECODE]["speedup"], "ratio": 1.7}}
    with pytest.raises(ValueError, match=r"rmsnorm decode-1x4096: 0 committed benches"):
        current.chosen_by("rmsnorm", moved, docs)
    other = {**entries[DECODE], "params": {"chunk_rows": 64}}
    with pytest.raises(ValueError, match="0 committed benches"):  # b.json's ratio is not it
        current.chosen_by("rmsnorm", other, docs)
    edited = {**entries[DECODE], "speedup": None, "edited": True}
    with pytest.raises(ValueError, match="has no speedup"):
        current.chosen_by("rmsnorm", edited, docs)
    twice = [*docs, (tmp_path / "copy.json", docs[0][1])]
    with pytest.raises(ValueError, match=r"2 committed benches.*a\.json.*copy\.json"):
        current.chosen_by("rmsnorm", entries[DECODE], twice)


def _root(tmp_path: Path) -> Path:
    """A repository with two tasks, a table, a block-tables folder and an e2e run."""
    for task in ("rmsnorm", "allreduce"):
        (tmp_path / "kernels" / task).mkdir(parents=True)
        (tmp_path / "kernels" / task / "task.py").write_text("")
    bench = tmp_path / "docs" / "benchmarks"
    (bench / "t").mkdir(parents=True)
    (bench / "t" / "dispatch-rmsnorm.json").write_text("{}")
    (bench / "blocks").mkdir()
    (bench / "e2e.json").write_text("{}")
    return tmp_path


B = "docs/benchmarks/"
GOOD = {
    "per_op": {"rmsnorm": B + "t/dispatch-rmsnorm.json"},
    "not_tabled": {"allreduce": "two GPUs"},
    "block_tables": B + "blocks",
    "blocks": [B + "e2e.json"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"per_op": {}}, r"missing \['rmsnorm'\], unknown \[\]"),
        ({"not_tabled": {"allreduce": "x", "swiglu": "y"}}, r"unknown \['swiglu'\]"),
        ({"not_tabled": {"allreduce": "", "rmsnorm": "x"}}, "both in 'per_op' and 'not_tabled'"),
        ({"not_tabled": {"allreduce": ""}}, "'not_tabled.allreduce' must say why"),
        ({"per_op": {"rmsnorm": B + "none.json"}}, "'per_op.rmsnorm': no such file docs/bench"),
        ({"block_tables": B + "e2e.json"}, "'block_tables': no such folder docs/benchmarks/e2e"),
        ({"blocks": [B + "e2e.json", 3]}, "'blocks\\[1\\]' must be a path"),
        ({"blocks": B + "e2e.json"}, "'blocks' must be a list"),
        ({"blocks": ["kernels/rmsnorm/task.py"]}, "'blocks\\[0\\]': kernels/.* is not under docs/"),
        ({"blocks": [B + "../../kernels/rmsnorm/task.py"]}, "is not under docs/benchmarks/"),
        ({"extra": 1}, "fields must be"),
    ],
)
def test_a_bad_manifest_is_rejected_with_the_field_named(
    tmp_path: Path, change: dict, message: str
) -> None:
    root = _root(tmp_path)
    path = root / "current.json"
    path.write_text(json.dumps(GOOD))
    manifest = current.load_manifest(path, root)
    assert manifest.per_op == {"rmsnorm": Path(B + "t/dispatch-rmsnorm.json")}
    assert manifest.blocks == [Path(B + "e2e.json")]
    path.write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(ValueError, match=message):
        current.load_manifest(path, root)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        current.load_manifest(path, root)


def test_a_table_of_another_task_is_rejected(tmp_path: Path) -> None:
    table = Path("docs/benchmarks/t.json")
    (tmp_path / table).parent.mkdir(parents=True)
    (tmp_path / table).write_text(json.dumps({"task": "swiglu", "entries": []}))
    with pytest.raises(ValueError, match=r"per_op\.rmsnorm: .* is the table of 'swiglu'"):
        current.per_op_section("rmsnorm", table, [], tmp_path)


def test_a_block_row_names_wrong_variants_and_the_tables_it_ran_on(tmp_path: Path) -> None:
    def ratio(r: float) -> dict:
        return {"ratio": r, "ci_low": r - 0.01, "ci_high": r + 0.01}

    result = {
        "kind": "llama",
        "mode": "decode",
        "batch": 1,
        "length": 4096,
        "layers": 4,
        "times_s": {
            v: {"median": t * 1e-6} for v, t in zip(current.VARIANTS, (9, 6, 4, 3), strict=True)
        },
        "correct": {"eager": True, "compiled": True, "tuned": False, "compiled-tuned": True},
        "tuned_vs_compiled": ratio(1.5),
        "compiled_tuned_vs_compiled": ratio(2.0),
        "stream_pct_of_copy": {"tuned": 88.04, "compiled-tuned": 90.96},
    }
    run = {"results": [result], "copy_bytes_per_s": 4.26e12, "read_bytes_per_s": 4.55e12}
    bench = tmp_path / "docs" / "benchmarks"
    bench.mkdir(parents=True)
    tables = Path("docs/benchmarks/s25/blocks")
    for name, where in [("in.json", f"/w/{tables}"), ("old.json", "docs/benchmarks/s17/b")]:
        (bench / name).write_text(json.dumps({**run, "dispatch_dir": where}))
    (row,) = current.block_rows(Path("docs/benchmarks/in.json"), tables, tmp_path)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:7] == ["llama (wrong: tuned)", "decode b1 4k", "4", "9.0", "6.0", "4.0", "3.0"]
    assert cells[7:12] == [
        "1.500x [1.490, 1.510]",
        "2.000x [1.990, 2.010]",
        "88.0 / 91.0",
        "4.26 / 4.55",
        "in force",
    ]
    (row,) = current.block_rows(Path("docs/benchmarks/old.json"), tables, tmp_path)
    assert "| s17/b |" in row
    # The tables in force timed beside the run's own (--also): a second row for them.
    also = {
        **result,
        "times_s": {
            **result["times_s"],
            "tuned:new": {"median": 3.5e-6},
            "compiled-tuned:new": {"median": 2.5e-6},
        },
        "correct": {**result["correct"], "tuned:new": True, "compiled-tuned:new": False},
        "also": {"new": {"tuned": ratio(1.1), "compiled_tuned": ratio(1.2)}, "x": {}},
        "stream_pct_of_copy": {"tuned:new": 89.5, "compiled-tuned:new": 92.04},
    }
    (bench / "also.json").write_text(
        json.dumps(
            {
                **run,
                "results": [also],
                "dispatch_dir": "docs/benchmarks/s17/b",
                "also": {"new": f"/w/{tables}", "x": "docs/benchmarks/s9/x"},
            }
        )
    )
    own, beside = current.block_rows(Path("docs/benchmarks/also.json"), tables, tmp_path)
    assert "| s17/b |" in own and "3.0 |" in own
    cells = [c.strip() for c in beside.strip("|").split("|")]
    assert cells[:7] == [
        "llama (wrong: compiled-tuned:new)",
        "decode b1 4k",
        "4",
        "9.0",
        "6.0",
        "3.5",
        "2.5",
    ]
    assert cells[7:12] == [
        "1.100x [1.090, 1.110] vs the run's tables",
        "1.200x [1.190, 1.210] vs the run's tables",
        "89.5 / 92.0",
        "4.26 / 4.55",
        "in force (as `--also new`)",
    ]
    chunk = {**result, "mode": "chunk", "length": 131072, "tokens": 8192}
    (bench / "chunk.json").write_text(json.dumps({**run, "results": [chunk]}))
    (row,) = current.block_rows(Path("docs/benchmarks/chunk.json"), tables, tmp_path)
    assert "| chunk b1 128k, its last 8k | 4 |" in row


def test_check_says_whether_the_page_is_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(current, "render", lambda manifest: "the page\n")
    monkeypatch.setattr(current, "load_manifest", lambda path: None)
    monkeypatch.setattr(current, "PAGE", tmp_path / "CURRENT.md")
    assert current.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert current.main([]) == 0
    assert (tmp_path / "CURRENT.md").read_text() == "the page\n"
    assert current.main(["--check"]) == 0


def test_the_block_tables_choices_that_differ_from_the_per_op_tables_are_listed(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path)

    def entry(shape: str, name: str, **extra) -> dict:
        return {"shape": shape, "source": "candidate", "name": name, "params": {}, **extra}

    per_op = [entry("a", "x.py"), entry("b", "x.py"), entry("c", "x.py")]
    block = [entry("a", "x.py"), entry("b", "y.py", edited=True), entry("d", "x.py")]
    for folder, entries in (("t", per_op), ("blocks", block)):
        table = {"task": "rmsnorm", "bucket_key": None, "entries": entries}
        (root / B / folder / "dispatch-rmsnorm.json").write_text(json.dumps(table))
    path = root / B / "current.json"
    path.write_text(json.dumps(GOOD))
    assert current.block_table_differences(current.load_manifest(path, root), root) == [
        "- rmsnorm b: the block tables run candidate y.py (edited by hand); the per-op table, "
        "candidate x.py",
        "- rmsnorm c: the block tables run no entry; the per-op table, candidate x.py",
        "- rmsnorm d: the block tables run candidate x.py; the per-op table, no entry",
    ]

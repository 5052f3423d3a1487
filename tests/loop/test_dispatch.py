"""Dispatch tables: per-shape winners, loaded as a function model code calls, and built from\n`autotune bench --json` documents (loop.dispatch.from_benches, scripts/dispatch_from_bench.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loop.dispatch import (
    Choice,
    build_dispatch,
    from_benches,
    load,
    save_dispatch,
    source_sha256,
)
from loop.tasks import load_task
from tests.source_files import import_file


def test_load_picks_by_shape(tmp_path: Path) -> None:
    rows = [
        {
            "shape": "decode",
            "dims": {"tokens": 1, "hidden": 4096},
            "source": "candidate",
            "name": "triton_rmsnorm.py",
            "params": {"BLOCK": 1024},
            "commit": "abc",
            "speedup": None,
        },
        {
            "shape": "long",
            "dims": {"tokens": 32768, "hidden": 4096},
            "source": "peer",
            "name": "torch.compile",
            "params": {},
            "speedup": None,
        },
    ]
    path = tmp_path / "d.json"
    save_dispatch(build_dispatch("rmsnorm", "tokens", rows), path)
    pick = load(path)
    assert pick(tokens=16, hidden=4096) == Choice(
        "candidate", "triton_rmsnorm.py", {"BLOCK": 1024}, "decode", "abc"
    )
    assert pick(tokens=100_000, hidden=4096).name == "torch.compile"
    with pytest.raises(LookupError):
        pick(tokens=16, hidden=7168)
    save_dispatch(build_dispatch("rmsnorm", "tokens", []), path)
    with pytest.raises(LookupError, match="no entries"):
        load(path)


# ------------------------------------------------------------------ tables from bench output

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "dispatch_from_bench.py"
DECODE, LONG = "decode-1x4096", "long-32768x4096"
COPY = 4.0e12


def _blocks(median: float, n: int = 10) -> list[float]:
    return [median * (1 + 0.002 * (i % 5 - 2)) for i in range(n)]


def _verdict(label: str, kind: str, times: dict[str, float], verdict: str = "accepted") -> dict:
    shapes = {s: {"name": s, "blocks_s": _blocks(t), "rel_err": 0.0} for s, t in times.items()}
    return {"label": label, "kind": kind, "params": {}, "verdict": verdict, "reasons": [],
            "shapes": shapes}  # fmt: skip


def _doc(cand: dict, peers: dict[str, dict], params: dict | None = None, verdict="accepted"):
    """A bench document as `autotune bench --json` writes it, with the CPU-runnable candidate."""
    return {
        **_verdict("candidate", "candidate", cand, verdict),
        "params": params or {},
        "language": "torch",
        "task": "rmsnorm",
        "candidate": str(ROOT / "kernels" / "rmsnorm" / "torch_rmsnorm.py"),
        "device": "cuda",
        "ceilings": {"copy_bytes_per_s": COPY},
        "table": [],
        "peer_verdicts": [_verdict(name, "peer", t) for name, t in peers.items()],
        "seconds": 1.0,
    }


def _by_shape(table: dict) -> dict[str, dict]:
    return {e["shape"]: e for e in table["entries"]}


def test_from_benches_keeps_the_candidate_where_it_is_clearly_faster() -> None:
    task = load_task("rmsnorm")
    doc = _doc(
        {DECODE: 5e-6, LONG: 4e-4},
        {"eager": {DECODE: 2e-5, LONG: 3e-3}, "torch.compile": {DECODE: 8e-6, LONG: 2e-4}},
        {"method": "vector_norm", "chunk_rows": 0},
    )
    table, rows = from_benches(task, [doc])
    assert table["task"] == "rmsnorm" and table["bucket_key"] == task.bucket_key
    entries = _by_shape(table)
    assert set(entries) == {DECODE, LONG}  # only the timed shapes
    dec, long = entries[DECODE], entries[LONG]
    assert dec["source"] == "candidate" and dec["name"] == "torch_rmsnorm.py"
    assert dec["params"] == {"method": "vector_norm", "chunk_rows": 0}
    assert dec["speedup"]["ci_low"] > 1.005 and dec["speedup"]["ratio"] == pytest.approx(1.6)
    assert dec["dims"]["tokens"] == 1 and dec["commit"] == ""
    assert long["source"] == "peer" and long["name"] == "torch.compile"
    assert long["params"] == {} and long["speedup"]["ci_high"] < 1.0
    row = {r["shape"]: r for r in rows}[LONG]
    assert row["winner"] == "peer" and row["best_peer"] == "torch.compile"
    assert row["median_us"] == pytest.approx(400.0)
    assert row["ci_low_us"] <= row["median_us"] <= row["ci_high_us"]
    assert row["peers_us"]["eager"] == pytest.approx(3000.0)
    low, high = row["peers_ci_us"]["eager"]
    assert low <= 3000.0 <= high and high - low < 3000.0 * 0.01
    shape = next(s for s in task.shapes("cuda") if s.name == LONG)
    assert row["copy_fraction"] == pytest.approx(task.bytes_moved(shape) / 4e-4 / COPY)
    assert row["tflops"] == pytest.approx(task.flops(shape) / 4e-4 / 1e12)


def test_from_benches_ignores_rejected_docs_and_takes_the_fastest_candidate() -> None:
    task = load_task("rmsnorm")
    rejected = _doc({DECODE: 1e-7, LONG: 1e-7}, {"torch.compile": {DECODE: 8e-6}}, verdict="no")
    slow = _doc({DECODE: 7e-6, LONG: 4e-4}, {"torch.compile": {DECODE: 3e-6}}, {"chunk_rows": 64})
    # the fastest candidate meets the peer of its own run, not the faster peer of another run
    fast = _doc({DECODE: 6e-6}, {"torch.compile": {DECODE: 9e-6}}, {"chunk_rows": 0})
    other_task = {**_doc({DECODE: 1e-7}, {}), "task": "add_rmsnorm"}
    other_device = {**_doc({DECODE: 1e-7}, {}), "device": "cpu"}
    table, rows = from_benches(task, [rejected, slow, fast, other_task, other_device])
    entries = _by_shape(table)
    assert entries[DECODE]["source"] == "candidate"
    assert entries[DECODE]["params"] == {"chunk_rows": 0}
    assert entries[DECODE]["speedup"]["ratio"] == pytest.approx(1.5)
    # LONG: timed only by `slow`, with no peer timed there: the candidate, without a speedup
    assert entries[LONG]["params"] == {"chunk_rows": 64} and entries[LONG]["speedup"] is None
    assert {r["shape"]: r["best_peer"] for r in rows} == {DECODE: "torch.compile", LONG: None}
    assert from_benches(task, [rejected])[0]["entries"] == []


def test_from_benches_names_a_malformed_field() -> None:
    doc = _doc({DECODE: 5e-6}, {})
    doc["peer_verdicts"] = None
    with pytest.raises(ValueError, match="peer_verdicts"):
        from_benches(load_task("rmsnorm"), [doc])


def test_from_benches_refuses_a_candidate_from_outside_the_task_folder(tmp_path) -> None:
    """A table names a file of the task's folder: an edited copy benched elsewhere would be
    swapped for the shipped file of the same name."""
    doc = _doc({DECODE: 5e-6}, {"torch.compile": {DECODE: 8e-6}})
    doc["candidate"] = str(tmp_path / "rmsnorm" / "torch_rmsnorm.py")
    with pytest.raises(ValueError, match="not a file of the task's folder"):
        from_benches(load_task("rmsnorm"), [doc])


def test_table_from_benches_drives_tuned_ops(tmp_path: Path) -> None:
    import torch

    from loop.blocks import tuned_ops

    decode16 = "decode-16x4096"
    doc = _doc({DECODE: 5e-6, decode16: 9e-6}, {"torch.compile": {DECODE: 8e-6, decode16: 5e-6}})
    table, _ = from_benches(load_task("rmsnorm"), [doc])
    save_dispatch(table, tmp_path / "dispatch-rmsnorm.json")
    ops = tuned_ops(tmp_path, "cpu")
    w = torch.ones(4096, dtype=torch.bfloat16)
    for tokens in (1, 20):
        ops.rmsnorm(torch.randn(tokens, 4096, dtype=torch.bfloat16), w)
    notes = "\n".join(ops.notes)
    assert "torch_rmsnorm.py (task folder) {} (tuned on decode-1x4096)" in notes, notes
    assert "peer 'torch.compile' wins, eager" in notes, notes


def _script():
    return import_file(SCRIPT)


def test_cli_writes_tables_and_markdown_and_skips_unreadable_files(tmp_path, capsys) -> None:
    benches = tmp_path / "benches"
    benches.mkdir()
    doc = _doc({DECODE: 5e-6, LONG: 4e-4}, {"torch.compile": {DECODE: 8e-6, LONG: 2e-4}})
    (benches / "bench-rmsnorm.json").write_text(json.dumps(doc))
    (benches / "bench-timed-out.json").write_text("")
    (benches / "sweep.json").write_text(json.dumps({"task": "rmsnorm", "sweep": []}))
    out, md = tmp_path / "out", tmp_path / "report.md"
    assert _script().main([str(out), str(benches), "--markdown", str(md)]) == 0
    printed = capsys.readouterr().out
    assert f"skipped {benches / 'bench-timed-out.json'}: not JSON" in printed
    assert f"skipped {benches / 'sweep.json'}" in printed
    table = json.loads((out / "dispatch-rmsnorm.json").read_text())
    assert {e["shape"]: e["source"] for e in table["entries"]} == {
        DECODE: "candidate",
        LONG: "peer",
    }
    report = md.read_text()
    assert "| decode-1x4096 | torch_rmsnorm.py |" in report
    assert "The peer keeps: long-32768x4096 (torch.compile)." in report
    assert report in printed


def test_cli_rejects_a_missing_path(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "out"), str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "no such file or folder" in proc.stderr and "nope.json" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_rows_say_whether_the_candidate_file_changed_since_the_bench(tmp_path, capsys) -> None:
    task = load_task("rmsnorm")
    current = source_sha256(task.folder / "torch_rmsnorm.py")
    times = ({DECODE: 5e-6}, {"torch.compile": {DECODE: 8e-6}})
    same, older, unrecorded = _doc(*times), _doc(*times), _doc(*times)
    same["candidate_sha256"] = current
    older["candidate_sha256"] = "0" * 64
    assert [from_benches(task, [d])[1][0]["file_changed"] for d in (same, older, unrecorded)] == [
        False,
        True,
        None,
    ]
    benches = tmp_path / "benches"
    benches.mkdir()
    (benches / "bench-rmsnorm.json").write_text(json.dumps(older))
    assert _script().main([str(tmp_path / "out"), str(benches)]) == 0
    printed = capsys.readouterr().out
    assert "changed since the bench: decode-1x4096 (torch_rmsnorm.py)." in printed
    (benches / "bench-rmsnorm.json").write_text(json.dumps(same))
    assert _script().main([str(tmp_path / "out"), str(benches)]) == 0
    assert "changed since the bench" not in capsys.readouterr().out


# ------------------------------------------------------------------ hand-edited variants


def _variant_script():
    return import_file(ROOT / "scripts" / "dispatch_variant.py")


def _tables(tmp_path: Path) -> Path:
    """A folder with an rmsnorm table (a candidate at decode, a peer at long) and a second file."""
    src = tmp_path / "src"
    rows = [
        {"shape": DECODE, "dims": {"tokens": 1, "hidden": 4096}, "source": "candidate",
         "name": "triton_rmsnorm.py", "params": {"num_warps": 4}, "commit": "abc",
         "speedup": {"ratio": 1.3}},
        {"shape": LONG, "dims": {"tokens": 32768, "hidden": 4096}, "source": "peer",
         "name": "torch.compile", "params": {}, "speedup": {"ratio": 0.9}},
    ]  # fmt: skip
    save_dispatch(build_dispatch("rmsnorm", "tokens", rows), src / "dispatch-rmsnorm.json")
    (src / "dispatch.md").write_text("tables\n")
    return src


def test_variant_changes_only_the_named_entries_and_marks_them(tmp_path: Path) -> None:
    src = _tables(tmp_path)
    dst = tmp_path / "dst"
    args = [str(src), str(dst), "--set", "rmsnorm", DECODE, "torch_rmsnorm.py", '{"chunk_rows": 0}']
    args += ["--set", "rmsnorm", LONG, "eager", "{}"]
    assert _variant_script().main(args) == 0
    pick = load(dst / "dispatch-rmsnorm.json")
    assert pick(tokens=1, hidden=4096) == Choice(
        "candidate", "torch_rmsnorm.py", {"chunk_rows": 0}, DECODE
    )
    assert pick(tokens=32768, hidden=4096) == Choice("peer", "eager", {}, LONG)
    edited = _by_shape(json.loads((dst / "dispatch-rmsnorm.json").read_text()))
    assert all(e["edited"] and e["speedup"] is None for e in edited.values())
    assert not (dst / "dispatch.md").exists()
    note = (dst / "VARIANT.txt").read_text()
    assert f"rmsnorm {DECODE} -> torch_rmsnorm.py" in note and f"rmsnorm {LONG} -> eager" in note
    original = _by_shape(json.loads((src / "dispatch-rmsnorm.json").read_text()))
    assert original[DECODE]["name"] == "triton_rmsnorm.py" and "edited" not in original[DECODE]


def test_variant_adds_an_entry_for_a_task_shape_the_table_lacks(tmp_path: Path) -> None:
    """decode-16x4096 is one of rmsnorm's shapes with no entry in the table: the variant adds
    one, marked edited, with the task shape's dims, and calls of 16 tokens now take it."""
    src = _tables(tmp_path)
    dst = tmp_path / "dst"
    args = [str(src), str(dst), "--set", "rmsnorm", "decode-16x4096", "eager", "{}"]
    assert load(src / "dispatch-rmsnorm.json")(tokens=16, hidden=4096).shape == DECODE
    assert _variant_script().main(args) == 0
    pick = load(dst / "dispatch-rmsnorm.json")
    assert pick(tokens=16, hidden=4096) == Choice("peer", "eager", {}, "decode-16x4096")
    assert pick(tokens=1, hidden=4096).shape == DECODE
    added = _by_shape(json.loads((dst / "dispatch-rmsnorm.json").read_text()))["decode-16x4096"]
    assert added["edited"] and added["dims"]["tokens"] == 16 and added["dims"]["hidden"] == 4096


def test_variant_makes_a_table_for_a_task_the_source_has_none_for(tmp_path: Path) -> None:
    """softmax has no table in the source: the variant writes one holding only the entry set,
    keyed as the task buckets, beside the source's tables copied unchanged."""
    src = _tables(tmp_path)
    dst = tmp_path / "dst"
    args = [str(src), str(dst), "--set", "softmax", "decode-64x128256", "eager", "{}"]
    assert _variant_script().main(args) == 0
    table = json.loads((dst / "dispatch-softmax.json").read_text())
    assert table["bucket_key"] == load_task("softmax").bucket_key
    assert [(e["shape"], e["name"], e["edited"]) for e in table["entries"]] == [
        ("decode-64x128256", "eager", True)
    ]
    assert (dst / "dispatch-rmsnorm.json").read_text() == (
        src / "dispatch-rmsnorm.json"
    ).read_text()


@pytest.mark.parametrize(
    "entry,message",
    [
        (["rmsnorm", "decode-7x7", "torch_rmsnorm.py", "{}"], "no entry for shape 'decode-7x7'"),
        (["rmsnorm", DECODE, "nope.py", "{}"], "no candidate file nope.py"),
        (["rmsnorm", DECODE, "sdpa", "{}"], "'sdpa' is neither a .py candidate nor a peer"),
        (["rmsnorm", LONG, "eager", '{"a": 1}'], "peer 'eager' takes no params"),
        (["rmsnorm", DECODE, "torch_rmsnorm.py", "[1]"], "expected a JSON object"),
        (["rmsnorm", DECODE, "torch_rmsnorm.py", "{bad"], "not JSON"),
        (["softmax", DECODE, "torch_softmax.py", "{}"], f"softmax: no entry for shape {DECODE!r}"),
    ],
)
def test_variant_rejects_bad_entries_and_writes_nothing(tmp_path, capsys, entry, message) -> None:
    src = _tables(tmp_path)
    dst = tmp_path / "dst"
    assert _variant_script().main([str(src), str(dst), "--set", *entry]) == 2
    assert message in capsys.readouterr().err
    assert not dst.exists()

"""The journal file: records on disk in order, open/closed state, torn lines, who owns it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from host_tuning.journal import (
    FORMAT,
    JournalError,
    JournalOpenError,
    append_record,
    close_journal,
    default_journal_path,
    owner_alive,
    process_identity,
    read_journal,
    start_journal,
)


def change(seq: int, setting: str = "gpu0.power_limit_w") -> dict:
    return {
        "event": "change",
        "seq": seq,
        "setting": setting,
        "index": 0,
        "uuid": "GPU-1",
        "snapshot": 450000 + seq,
        "before": 450,
        "after": 600,
    }


def started(tmp_path: Path) -> Path:
    path = tmp_path / "j" / "host-journal.jsonl"
    start_journal(path, {"profile": "max", **process_identity()})
    return path


def test_records_read_back_in_order_and_pending_is_last_first(tmp_path: Path) -> None:
    path = started(tmp_path)
    for seq in (1, 2, 3):
        append_record(path, change(seq))
        append_record(path, {"event": "applied", "seq": seq})
    append_record(path, {"event": "undone", "seq": 3})
    journal = read_journal(path)
    assert journal is not None and not journal.closed
    assert journal.header["format"] == FORMAT and journal.header["profile"] == "max"
    assert [e.seq for e in journal.entries] == [1, 2, 3]
    assert journal.entries[1].snapshot == 450002
    assert journal.applied == {1, 2, 3} and journal.undone == {3}
    assert [e.seq for e in journal.pending] == [2, 1]
    lines = path.read_text().splitlines()
    assert all(json.loads(line)["time"] > 0 for line in lines)
    close_journal(path, "restored")
    closed = read_journal(path)
    assert closed.closed and closed.close_reason == "restored"


def test_an_open_journal_blocks_a_new_one_and_a_closed_one_is_kept_as_prev(
    tmp_path: Path,
) -> None:
    path = started(tmp_path)
    append_record(path, change(1))
    with pytest.raises(JournalOpenError, match="run `autotune host restore --journal ") as refused:
        start_journal(path, {"profile": "stable", **process_identity()})
    assert refused.value.needs_restore
    close_journal(path, "restored")
    start_journal(path, {"profile": "stable", **process_identity()})
    assert read_journal(path).header["profile"] == "stable"
    previous = read_journal(path.with_name(path.name + ".prev"))
    assert previous.header["profile"] == "max" and previous.closed


def test_a_journal_whose_apply_still_runs_elsewhere_needs_no_restore(tmp_path: Path) -> None:
    code = (
        "import json, sys, time; sys.path[:0] = [sys.argv[1]]; "
        "from host_tuning.journal import process_identity as p; "
        "print(json.dumps(p()), flush=True); time.sleep(60)"
    )
    root = str(Path(__file__).resolve().parents[2])
    with subprocess.Popen([sys.executable, "-c", code, root], stdout=subprocess.PIPE) as child:
        try:
            owner = json.loads(child.stdout.readline())
            path = tmp_path / "host-journal.jsonl"
            start_journal(path, {"profile": "max", **owner})
            with pytest.raises(JournalOpenError, match="another apply is running") as refused:
                start_journal(path, {"profile": "max", **process_identity()})
            assert not refused.value.needs_restore
        finally:
            child.kill()


def test_a_line_torn_by_a_crash_is_skipped_and_the_next_record_starts_clean(
    tmp_path: Path,
) -> None:
    path = started(tmp_path)
    append_record(path, change(1))
    with open(path, "a") as f:
        f.write('{"event": "change", "seq": 2, "sett')  # killed mid-write
    journal = read_journal(path)
    assert [e.seq for e in journal.entries] == [1] and journal.skipped_lines == 1
    append_record(path, {"event": "undone", "seq": 1})
    again = read_journal(path)
    assert again.undone == {1} and again.skipped_lines == 1


def test_what_is_not_a_journal_is_refused_with_the_path(tmp_path: Path) -> None:
    assert read_journal(tmp_path / "absent.jsonl") is None
    other = tmp_path / "notes.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(JournalError, match=r"notes\.jsonl"):
        read_journal(other)
    with pytest.raises(JournalError, match=r"notes\.jsonl"):
        start_journal(other, {})


def test_owner_alive_tells_a_running_process_from_a_dead_one() -> None:
    assert owner_alive(process_identity())
    child = subprocess.run(
        [sys.executable, "-c", "import json, sys; sys.path[:0] = [sys.argv[1]]; "
         "from host_tuning.journal import process_identity as p; print(json.dumps(p()))",
         str(Path(__file__).resolve().parents[2])],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    dead = json.loads(child.stdout)
    assert dead["pid"] != os.getpid()
    assert not owner_alive(dead)
    assert not owner_alive({**process_identity(), "boot_id": "another-boot"})
    assert not owner_alive({**process_identity(), "pid_started": 1.0})


def test_default_path_env_root_and_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTOTUNE_HOST_JOURNAL", str(tmp_path / "x.jsonl"))
    assert default_journal_path() == tmp_path / "x.jsonl"
    monkeypatch.delenv("AUTOTUNE_HOST_JOURNAL")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_journal_path() == tmp_path / "state" / "autotune" / "host-journal.jsonl"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_journal_path().parts[-2:] == ("autotune", "host-journal.jsonl")
    assert default_journal_path().parts[1] in ("run", "var")

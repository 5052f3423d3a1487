"""The apply journal: JSON lines, each one written and fsync'ed before what it announces.

Records, in order: "open" (who applies what, where), then per change "change"
(written BEFORE the change: the old value), then "applied" or "failed" after it,
"undone" after its undo, and a final "close". A journal without "close" is open:
an apply holds its changes, or a process died with them in place and
`apply.restore_journal` must undo them. A line torn by a crash is skipped: the
change it announced was never made, since every change follows its fsync'ed line.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

FORMAT = "autotune.host-journal/1"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
ENV_PATH = "AUTOTUNE_HOST_JOURNAL"


class JournalError(Exception):
    """The journal cannot be used (unreadable, foreign, busy); the message says what to do."""

    needs_restore = False  # the message sends the user to `autotune host restore`


class JournalOpenError(JournalError):
    """An earlier apply's journal is still open: restore it before applying again."""


class JournalPathError(JournalError):
    """The journal cannot be read or created where asked: bad input (exit 2), nothing was
    changed."""

    exit_code = 2


@dataclass(frozen=True)
class JournalEntry:
    """One announced change: `snapshot` is the old value that restore puts back."""

    seq: int
    setting: str
    index: int | None
    uuid: str | None
    snapshot: Any
    before: Any
    after: Any


@dataclass(frozen=True)
class Journal:
    path: Path
    header: dict[str, Any]
    entries: list[JournalEntry]
    applied: frozenset[int]
    failed: frozenset[int]
    undone: frozenset[int]
    closed: bool
    close_reason: str | None
    skipped_lines: int  # lines torn by a crash

    @property
    def pending(self) -> list[JournalEntry]:
        """Entries not yet undone, last first (the order to undo them in)."""
        return [e for e in reversed(self.entries) if e.seq not in self.undone]

    def describe(self) -> str:
        h = self.header
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("time", 0)))
        return (
            f"journal {self.path} (profile {h.get('profile')!r}, pid {h.get('pid')}, "
            f"started {started}, {len(self.pending)} change(s) to undo)"
        )


def default_journal_path() -> Path:
    """$AUTOTUNE_HOST_JOURNAL, else /run/autotune/ for root (cleared by a reboot, as the
    settings are), else $XDG_STATE_HOME/autotune/ (~/.local/state/autotune/)."""
    if os.environ.get(ENV_PATH):
        return Path(os.environ[ENV_PATH])
    name = "host-journal.jsonl"
    if os.geteuid() == 0:
        base = Path("/run") if Path("/run").is_dir() else Path("/var/lib")
        return base / "autotune" / name
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "autotune" / name


def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return None


def process_identity() -> dict[str, Any]:
    """pid, start time and boot of this process: enough to tell later whether it still runs."""
    return {
        "pid": os.getpid(),
        "pid_started": psutil.Process().create_time(),
        "boot_id": boot_id(),
    }


def owner_alive(header: dict[str, Any]) -> bool:
    """True when the process that opened the journal still runs (same pid, start time, boot)."""
    if header.get("boot_id") and header["boot_id"] != boot_id():
        return False
    try:
        proc = psutil.Process(int(header["pid"]))
        started = proc.create_time()
        zombie = proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
    return not zombie and abs(started - float(header.get("pid_started", 0))) < 0.05


def from_earlier_boot(header: dict[str, Any]) -> bool:
    current = boot_id()
    return bool(header.get("boot_id") and current and header["boot_id"] != current)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record and fsync it; a line torn by an earlier crash is ended first."""
    line = json.dumps({**record, "time": time.time()}) + "\n"
    try:
        with open(path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise JournalError(f"cannot write journal {path}: {err.strerror or err}") from err


def start_journal(path: Path, header: dict[str, Any]) -> None:
    """Create the journal with its "open" record; JournalOpenError while an earlier one is open.

    A closed earlier journal is kept as <name>.prev.
    """
    path = Path(path)
    existing = read_journal(path)
    if existing is not None and not existing.closed:
        raise open_error(existing)
    line = json.dumps({"event": "open", "format": FORMAT, **header, "time": time.time()})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if existing is not None:
            os.replace(path, path.with_name(path.name + ".prev"))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    except FileExistsError:
        raced = read_journal(path)
        raise (open_error(raced) if raced else JournalOpenError(f"{path} appeared")) from None
    except OSError as err:
        raise JournalPathError(f"cannot create journal {path}: {err.strerror or err}") from err
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path)


def close_journal(path: Path, reason: str) -> None:
    append_record(path, {"event": "close", "reason": reason})


def open_error(journal: Journal) -> JournalOpenError:
    """The refusal to apply over `journal`, an open one; it needs a restore unless the process
    that applied it still runs (and restores on exit)."""
    error = JournalOpenError(open_message(journal))
    error.needs_restore = not _applied_elsewhere(journal)
    return error


def _applied_elsewhere(journal: Journal) -> bool:
    return owner_alive(journal.header) and journal.header.get("pid") != os.getpid()


def open_message(journal: Journal) -> str:
    if _applied_elsewhere(journal):
        return (
            f"another apply is running: {journal.describe()}; stop that process "
            "(it restores its changes on exit) before applying again"
        )
    return (
        f"an earlier apply left its {journal.describe()} open: run `autotune host restore "
        f"--journal {journal.path}` to undo it first"
    )


def _parse(path: Path) -> tuple[list[dict[str, Any]], int]:
    records, skipped = [], 0
    for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            skipped += 1
            continue
        if not isinstance(record, dict) or "event" not in record:
            raise JournalError(f"{path}: line {number} is not a journal record")
        records.append(record)
    return records, skipped


def read_journal(path: Path) -> Journal | None:
    """The journal at `path`, or None when there is none. JournalError when it is not one."""
    path = Path(path)
    try:
        records, skipped = _parse(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise JournalPathError(f"cannot read journal {path}: {err.strerror or err}") from err
    if not records or records[0]["event"] != "open" or records[0].get("format") != FORMAT:
        raise JournalError(
            f"{path} is not an autotune host journal (no {FORMAT} open record); "
            "move it away if it is not needed"
        )
    entries, marks = [], {"applied": set(), "failed": set(), "undone": set()}
    close_reason = None
    closed = False
    for record in records[1:]:
        event = record["event"]
        try:
            if event == "change":
                entries.append(
                    JournalEntry(
                        seq=int(record["seq"]),
                        setting=str(record["setting"]),
                        index=record.get("index"),
                        uuid=record.get("uuid"),
                        snapshot=record.get("snapshot"),
                        before=record.get("before"),
                        after=record.get("after"),
                    )
                )
            elif event in marks:
                marks[event].add(int(record["seq"]))
            elif event == "close":
                closed, close_reason = True, record.get("reason")
        except (KeyError, TypeError, ValueError) as err:
            raise JournalError(f"{path}: bad {event!r} record: {err}") from err
    return Journal(
        path=path,
        header=records[0],
        entries=entries,
        applied=frozenset(marks["applied"]),
        failed=frozenset(marks["failed"]),
        undone=frozenset(marks["undone"]),
        closed=closed,
        close_reason=close_reason,
        skipped_lines=skipped,
    )

"""Apply a profile through the journal; undo it on error, SIGINT/SIGTERM, exit, or after a crash.

    changes = plan(profile, backend)                       # the dry run: reads only
    apply_profile(profile, backend, journal)               # changes stay, journal open
    restore_journal(journal, backend)                      # `autotune host restore`
    with profile_applied(profile, backend, journal): ...   # undone when the block ends

For each change the old value is journaled and fsync'ed, the setter runs, and the
value is read back (some setters report success without effect). Any failure or
signal undoes every change in reverse order before the error reaches the caller;
if an undo itself fails, the journal stays open for `autotune host restore`.

`python -m host_tuning.apply --simulate FIXTURE --state FILE ...` runs the same code
on a simulated device whose state persists in FILE, so that a second process (the
crash tests) sees what the first one did.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from host_tuning.fact import REAL_ROOT
from host_tuning.journal import (
    JournalEntry,
    JournalError,
    append_record,
    close_journal,
    from_earlier_boot,
    open_error,
    owner_alive,
    process_identity,
    read_journal,
    start_journal,
)
from host_tuning.nvml_base import NvmlBackend, NvmlError
from host_tuning.nvml_sim import SimulatedNvml
from host_tuning.profiles import Change, Profile, ProfileError, load_profile, plan
from host_tuning.settings import Setting, SettingUnavailable, Target, setting_for

SIGNALS = (signal.SIGINT, signal.SIGTERM)
Record = dict[str, Any]
OnRecord = Callable[[Record], None]


class ApplyError(Exception):
    """An apply or restore that did not happen, or was undone; the message is for users."""

    needs_restore = False  # the message sends the user to `autotune host restore`


class ApplyRefused(ApplyError):
    """Refused before any change: not root, GPU in use."""


class ApplyFailed(ApplyError):
    """A change failed or did not read back; every change was undone."""


class RestoreError(ApplyError):
    """Some settings could not be put back; the journal stays open for `host restore`."""

    needs_restore = True


class ApplyInterrupted(BaseException):
    """SIGINT or SIGTERM during an apply or while a profile is held; the changes were undone.

    Like KeyboardInterrupt it is not an Exception, so `except Exception` in code run
    under `profile_applied` does not swallow it.
    """

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(message or f"interrupted by {name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# What the CLI catches and prints (str(err) is the message); anything else is a bug.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ProfileError,
    JournalError,
    ApplyError,
    ApplyInterrupted,
    NvmlError,
)


@dataclass(frozen=True)
class ApplyResult:
    profile: str
    journal: Path
    changes: list[Change]  # applied and skipped

    @property
    def applied(self) -> list[Change]:
        return [c for c in self.changes if c.status == "applied"]


@dataclass(frozen=True)
class RestoreResult:
    journal: Path
    changes: list[Change]  # status "restored", before = the profile's value
    note: str


class _Signals:
    """SIGINT/SIGTERM become ApplyInterrupted, raised only inside `allow()` or at `check()`."""

    def __init__(self) -> None:
        self.deferred = True
        self.pending: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.deferred:
            self.pending = self.pending or signum
            return
        self.deferred = True
        raise ApplyInterrupted(signum)

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def check(self) -> None:
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise ApplyInterrupted(signum)

    @contextmanager
    def allow(self) -> Iterator[None]:
        self.check()
        self.deferred = False
        try:
            yield
        finally:
            self.deferred = True


@contextmanager
def _signal_guard() -> Iterator[_Signals]:
    signals = _Signals()
    signals.install()
    try:
        yield signals
    finally:
        signals.uninstall()


def _why(err: BaseException) -> str:
    if isinstance(err, OSError):
        return f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
    return str(err)


def _verify(check: Callable[[Target, Any], str | None], target: Target, value: Any) -> str | None:
    try:
        return check(target, value)
    except SettingUnavailable as err:
        return f"cannot read it back: {err}"


def _uuid(backend: NvmlBackend | None, index: int | None) -> str | None:
    return None if backend is None or index is None else backend.read(index, "uuid").value


def _index_for(backend: NvmlBackend | None, entry: JournalEntry) -> int | None:
    """The GPU index of a journal entry now, found by UUID (indices can move)."""
    if entry.index is None:
        return None
    if backend is None:
        raise SettingUnavailable("no NVML to restore a GPU setting with")
    count = backend.device_count()
    if entry.uuid is None:
        return entry.index
    order = [entry.index, *range(count)] if entry.index < count else list(range(count))
    for index in order:
        if backend.read(index, "uuid").value == entry.uuid:
            return index
    raise SettingUnavailable(f"GPU {entry.uuid} is not present")


# --- apply -----------------------------------------------------------------------


def _refuse(backend: NvmlBackend | None, planned: list[Change], cpu_root: Path) -> None:
    gpus = sorted({i for c in planned if (i := setting_for(c.setting)[1]) is not None})
    cpu = any(setting_for(c.setting)[1] is None for c in planned)
    real_gpu = bool(gpus) and backend is not None and backend.kind == "real"
    if (real_gpu or (cpu and cpu_root == REAL_ROOT)) and os.geteuid() != 0:
        raise ApplyRefused(
            "applying a profile needs root (clocks, power limits and CPU governors are "
            "root-only): run it with sudo; the dry run needs nothing"
        )
    for index in gpus:
        reading = backend.read(index, "compute_processes")
        if not reading.ok:
            raise ApplyRefused(
                f"gpu{index}: cannot tell whether other processes use it ({reading.reason}); "
                "nothing was changed"
            )
        others = [pid for pid in reading.value if pid != os.getpid()]
        if others:
            raise ApplyRefused(
                f"gpu{index} is in use by pid(s) {', '.join(map(str, others))}: stop them first "
                "(changing clocks or power under a running job changes its results); "
                "nothing was changed"
            )


def _header(
    profile: Profile, backend: NvmlBackend | None, cpu_root: Path, planned: list[Change]
) -> Record:
    return {
        "profile": profile.name,
        "profile_source": profile.source,
        "nvml": backend.kind if backend is not None else None,
        "nvml_source": getattr(backend, "source", None),
        "cpu_root": str(cpu_root.resolve()),
        "planned": [c.setting for c in planned],
        **process_identity(),
    }


def _apply_one(
    seq: int,
    change: Change,
    backend: NvmlBackend | None,
    cpu_root: Path,
    record: Callable[[Record, bool], None],
) -> Change:
    setting, index = setting_for(change.setting)
    target = Target(backend, index, cpu_root)
    try:
        snapshot = setting.snapshot(target)
    except SettingUnavailable as err:
        raise ApplyFailed(f"{change.setting}: {err}") from err
    before = setting.shown(snapshot)
    entry = {
        "event": "change",
        "seq": seq,
        "setting": change.setting,
        "index": index,
        "uuid": _uuid(backend, index),
        "snapshot": snapshot,
        "before": before,
        "after": change.after,
    }
    record(entry, True)
    try:
        setting.write(target, change.after)
    except (NvmlError, OSError) as err:
        record({"event": "failed", "seq": seq, "error": _why(err)}, False)
        raise ApplyFailed(f"{change.setting}: {_why(err)}") from err
    problem = _verify(setting.verify, target, change.after)
    if problem:
        raise ApplyFailed(
            f"{change.setting}: the setter reported success but the value did not take: {problem}"
        )
    record({"event": "applied", "seq": seq}, False)
    return replace(change, before=before, status="applied")


def _apply(
    profile: Profile,
    backend: NvmlBackend | None,
    journal_path: Path,
    index: int | None,
    cpu_root: Path,
    signals: _Signals,
    on_record: OnRecord | None,
) -> ApplyResult:
    existing = read_journal(journal_path)
    if existing is not None and not existing.closed:
        raise open_error(existing)
    changes = plan(profile, backend, index, cpu_root=cpu_root)
    planned = [c for c in changes if c.status == "planned"]
    if not planned:
        return ApplyResult(profile.name, journal_path, changes)
    _refuse(backend, planned, cpu_root)
    start_journal(journal_path, _header(profile, backend, cpu_root, planned))

    def record(rec: Record, interruptible: bool) -> None:
        append_record(journal_path, rec)
        if on_record is None:
            return
        if interruptible:
            with signals.allow():
                on_record(rec)
        else:
            on_record(rec)

    done: dict[str, Change] = {}
    try:
        for seq, change in enumerate(planned, 1):
            signals.check()  # a signal that arrived during the last change is raised here
            done[change.setting] = _apply_one(seq, change, backend, cpu_root, record)
    except BaseException as err:
        _unwind(journal_path, backend, err, on_record)
        raise  # _unwind raises; this only satisfies the reader
    return ApplyResult(profile.name, journal_path, [done.get(c.setting, c) for c in changes])


def _unwind(
    journal_path: Path, backend: NvmlBackend | None, err: BaseException, on_record: OnRecord | None
) -> None:
    """Undo everything the journal holds after `err`, then raise what the caller should see."""
    restored, failures = _undo(journal_path, backend, on_record, f"undone after: {err}")
    if failures:
        raise RestoreError(
            f"{err}; undoing the changes failed for {'; '.join(failures)}. The journal "
            f"{journal_path} stays open: fix the cause and run `autotune host restore`"
        ) from err
    undone = f"undid {len(restored)} change(s): nothing is left changed"
    if isinstance(err, ApplyInterrupted):
        raise ApplyInterrupted(err.signum, f"{err}; {undone}") from None
    if isinstance(err, ApplyError):
        raise type(err)(f"{err}; {undone}") from err
    raise err


def apply_profile(
    profile: Profile,
    backend: NvmlBackend | None,
    journal_path: Path,
    *,
    index: int | None = 0,
    cpu_root: Path = REAL_ROOT,
    on_record: OnRecord | None = None,
) -> ApplyResult:
    """Apply `profile` to GPU `index` (None: every GPU) and the CPU side under `cpu_root`.

    The changes stay in place and the journal stays open until `restore_journal`.
    Refuses (ApplyRefused, JournalOpenError, ProfileError) before changing anything
    when not root, when other processes use the GPU, when a value is outside what the
    part allows, or when an earlier journal is open. On a failed change, a value
    that does not read back, SIGINT or SIGTERM, every change is undone first.
    `on_record(record)` is called after each journal record is on disk.
    """
    with _signal_guard() as signals:
        return _apply(
            profile, backend, Path(journal_path), index, Path(cpu_root), signals, on_record
        )


@contextmanager
def profile_applied(
    profile: Profile,
    backend: NvmlBackend | None,
    journal_path: Path,
    *,
    index: int | None = 0,
    cpu_root: Path = REAL_ROOT,
    on_record: OnRecord | None = None,
) -> Iterator[ApplyResult]:
    """`apply_profile`, held for the block and undone when it ends, fails, or on SIGINT/SIGTERM
    (raised in the block as ApplyInterrupted)."""
    journal_path = Path(journal_path)
    with _signal_guard() as signals:
        result = _apply(profile, backend, journal_path, index, Path(cpu_root), signals, on_record)
        try:
            with signals.allow():
                yield result
        finally:
            if result.applied:
                _, failures = _undo(journal_path, backend, on_record, "restored on exit")
                if failures:
                    raise RestoreError(
                        f"could not put back {'; '.join(failures)}; the journal {journal_path} "
                        "stays open: fix the cause and run `autotune host restore`"
                    )
        signals.check()


# --- undo and restore ------------------------------------------------------------


def _undo_one(setting: Setting, target: Target, entry: JournalEntry) -> str | None:
    try:
        setting.restore(target, entry.snapshot)
    except (NvmlError, OSError) as err:
        return _why(err)
    return _verify(setting.verify_restored, target, entry.snapshot)


def _undo(
    journal_path: Path, backend: NvmlBackend | None, on_record: OnRecord | None, reason: str
) -> tuple[list[Change], list[str]]:
    """Undo the journal's pending entries, last first; close it when all are back."""
    journal = read_journal(journal_path)
    if journal is None or journal.closed:
        return [], []
    cpu_root = Path(journal.header.get("cpu_root") or REAL_ROOT)
    restored, failures, unrecorded = [], [], []
    for entry in journal.pending:
        setting, _ = setting_for(entry.setting)
        try:
            target = Target(backend, _index_for(backend, entry), cpu_root)
            problem = _undo_one(setting, target, entry)
        except SettingUnavailable as err:
            problem = str(err)
        failed_setter = entry.seq in journal.failed
        if problem and not failed_setter:
            failures.append(f"{entry.setting}: {problem}")
            continue
        note = "its setter had failed: nothing to undo" if failed_setter else ""
        if entry.seq not in journal.applied and not failed_setter:
            note = "journaled, not confirmed applied: put back anyway"
        restored.append(Change(entry.setting, entry.after, entry.before, "restored", note))
        try:
            _record(journal_path, {"event": "undone", "seq": entry.seq}, on_record)
        except JournalError as err:  # keep undoing: the settings matter more than the record
            unrecorded.append(str(err))
    if failures:
        return restored, failures
    try:
        _record(journal_path, {"event": "close", "reason": reason}, on_record)
    except JournalError as err:
        unrecorded.append(str(err))
    if unrecorded:
        failures.append(
            f"every setting is back, but the journal could not record it ({unrecorded[0]}); "
            "a later restore only writes the same old values again"
        )
    return restored, failures


def _record(journal_path: Path, record: Record, on_record: OnRecord | None) -> None:
    append_record(journal_path, record)
    if on_record is not None:
        on_record(record)


def restore_journal(
    journal_path: Path,
    backend: NvmlBackend | None,
    *,
    force: bool = False,
    on_record: OnRecord | None = None,
) -> RestoreResult:
    """Undo what an open journal holds (`autotune host restore`), last change first, and close it.

    Nothing to do when there is no journal or it is closed. Refuses (JournalError)
    while the process that applied it still runs, unless `force`. A journal from
    before a reboot is closed without changes: the reboot reset those settings.
    RestoreError when a setting cannot be put back; the journal then stays open.
    """
    journal_path = Path(journal_path)
    journal = read_journal(journal_path)
    if journal is None:
        return RestoreResult(journal_path, [], f"no journal at {journal_path}: nothing to restore")
    if journal.closed:
        return RestoreResult(
            journal_path,
            [],
            f"{journal_path} is closed ({journal.close_reason}): nothing to restore",
        )
    header = journal.header
    if not force and header.get("pid") != os.getpid() and owner_alive(header):
        raise JournalError(
            f"the process that applied it still runs: {journal.describe()}; stop it "
            "(it restores its changes on exit), or force the restore"
        )
    if from_earlier_boot(header):
        reason = "stale: written before a reboot, which reset these settings"
        close_journal(journal_path, reason)
        return RestoreResult(journal_path, [], f"{journal_path}: {reason}; closed it")
    gpu_entries = any(e.index is not None for e in journal.entries)
    kind = backend.kind if backend is not None else None
    if gpu_entries and kind != header.get("nvml"):
        raise JournalError(
            f"{journal.describe()} was written for a {header.get('nvml')} NVML device, "
            f"but the device at hand is {kind or 'absent'}"
        )
    with _signal_guard():  # SIGINT/SIGTERM wait until every setting is back
        restored, failures = _undo(journal_path, backend, on_record, "restored")
    if failures:
        raise RestoreError(
            f"could not put back {'; '.join(failures)}; the journal {journal_path} stays open: "
            "fix the cause and run `autotune host restore` again"
        )
    return RestoreResult(
        journal_path, restored, f"restored {len(restored)} change(s); closed {journal_path}"
    )


# --- for the CLI -----------------------------------------------------------------

STATUS_STYLE = {
    "planned": "yellow",
    "applied": "green",
    "restored": "cyan",
    "skipped": "dim",
    "failed": "bold red",
}


def format_value(setting: str, value: Any) -> str:
    """A setting's value for a table: "700 W", "1755 MHz", "+100 MHz", "on", "?"."""
    if value is None:
        return "?"
    try:
        unit = setting_for(setting)[0].unit
    except ValueError:
        unit = ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list) and len(value) == 2:
        lo, hi = value
        return f"{lo} {unit}".strip() if lo == hi else f"{lo}-{hi} {unit}".strip()
    if isinstance(value, int | float) and setting.endswith("_offset_mhz"):
        return f"{value:+g} {unit}"
    if isinstance(value, int | float):
        return f"{value:g} {unit}".strip()
    return str(value)


def render_plan_table(
    changes: list[Change] | list[dict[str, Any]], title: str = "Profile plan (dry run)"
) -> Table:
    """A rich table of changes (Change objects or their dicts): setting, before, after, status."""
    table = Table(title=title)
    for column in ("setting", "before", "after", "status", "note"):
        table.add_column(column, overflow="fold")
    for change in changes:
        row = change if isinstance(change, dict) else change.to_dict()
        status = row.get("status", "planned")
        table.add_row(
            row["setting"],
            format_value(row["setting"], row["before"]),
            format_value(row["setting"], row["after"]),
            f"[{STATUS_STYLE.get(status, '')}]{status}[/]",
            row.get("note") or "",
        )
    return table


def render_profiles_table(profiles: list[Profile]) -> Table:
    """`autotune host profiles`: name, what it does, where it is."""
    table = Table(title="Host profiles")
    for column in ("name", "description", "file"):
        table.add_column(column, overflow="fold")
    for profile in profiles:
        table.add_row(profile.name, profile.description, profile.source)
    return table


def report_section(
    profile: str, changes: list[Change], *, applied: bool, restored: bool | None = None
) -> dict[str, Any]:
    """The report's `profile` object: mode "applied" or "dry-run", the changes, restored."""
    return {
        "name": profile,
        "mode": "applied" if applied else "dry-run",
        "changes": [c.to_dict() for c in changes],
        "restored": restored if applied else None,
    }


# --- a simulated device that outlives its process ------------------------------------


class PersistentSimulatedNvml:
    """A SimulatedNvml whose successful writes are appended to `state_path` and replayed on open.

    Two processes that open the same fixture and state file see one device: what
    one wrote, the other reads. Writes that `noop_writes` swallows are not kept.
    """

    kind = "simulated"

    def __init__(
        self,
        fixture: str | Path,
        state_path: Path,
        *,
        root: bool = True,
        noop_writes: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.device = SimulatedNvml.from_fixture(fixture, overrides=overrides)
        self.source = self.device.source
        self.state_path = Path(state_path)
        if self.state_path.exists():
            for line in self.state_path.read_text().splitlines():
                if line.strip():
                    call = json.loads(line)
                    getattr(self.device, call["write"])(*call["args"])
        self.device.root = root
        self.device.noop_writes = noop_writes

    def _write(self, name: str, *args: Any) -> None:
        getattr(self.device, name)(*args)
        if self.device.noop_writes:
            return
        with open(self.state_path, "a") as f:
            f.write(json.dumps({"write": name, "args": list(args)}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def device_count(self) -> int:
        return self.device.device_count()

    def read(self, index: int, field: str) -> Any:
        return self.device.read(index, field)

    def read_system(self, field: str) -> Any:
        return self.device.read_system(field)

    def close(self) -> None:
        self.device.close()

    def locked_clocks(self, index: int) -> dict[str, tuple[int, int]]:
        return self.device.locked_clocks(index)

    def set_persistence_mode(self, index: int, enabled: bool) -> None:
        self._write("set_persistence_mode", index, enabled)

    def set_power_limit(self, index: int, milliwatts: int) -> None:
        self._write("set_power_limit", index, milliwatts)

    def set_gpu_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        self._write("set_gpu_locked_clocks", index, min_mhz, max_mhz)

    def reset_gpu_locked_clocks(self, index: int) -> None:
        self._write("reset_gpu_locked_clocks", index)

    def set_memory_locked_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        self._write("set_memory_locked_clocks", index, min_mhz, max_mhz)

    def reset_memory_locked_clocks(self, index: int) -> None:
        self._write("reset_memory_locked_clocks", index)

    def set_applications_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> None:
        self._write("set_applications_clocks", index, memory_mhz, graphics_mhz)

    def reset_applications_clocks(self, index: int) -> None:
        self._write("reset_applications_clocks", index)

    def set_gpc_clk_vf_offset(self, index: int, offset_mhz: int) -> None:
        self._write("set_gpc_clk_vf_offset", index, offset_mhz)

    def set_mem_clk_vf_offset(self, index: int, offset_mhz: int) -> None:
        self._write("set_mem_clk_vf_offset", index, offset_mhz)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m host_tuning.apply",
        description="Apply or restore a profile on a simulated NVML device whose state "
        "persists in a file (crash tests, demos). Real hosts use `autotune host apply`.",
    )
    parser.add_argument("--simulate", required=True, metavar="FIXTURE")
    parser.add_argument("--state", required=True, type=Path, help="the device's state file")
    parser.add_argument("--journal", required=True, type=Path)
    parser.add_argument("--cpu-root", required=True, type=Path, help="a fake sysfs tree")
    parser.add_argument("--profile", default="stable", help="a shipped name or a .json path")
    parser.add_argument("--gpu", default="0", help="GPU index, or 'all'")
    parser.add_argument("--restore", action="store_true", help="restore the journal instead")
    parser.add_argument("--hold", action="store_true", help="hold until SIGINT/SIGTERM")
    parser.add_argument(
        "--pause-at", type=int, metavar="K", help="after journaling change K, print and wait"
    )
    parser.add_argument("--noop-writes", action="store_true")
    parser.add_argument("--no-root", action="store_true")
    parser.add_argument("--processes", default="", help="pids the device says use it: 1,2")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    pids = [int(p) for p in args.processes.split(",") if p.strip()]
    backend = PersistentSimulatedNvml(
        args.simulate,
        args.state,
        root=not args.no_root,
        noop_writes=args.noop_writes,
        overrides={"compute_processes": pids} if pids else None,
    )

    def on_record(record: Record) -> None:
        print(json.dumps(record), flush=True)
        if record["event"] == "change" and record["seq"] == args.pause_at:
            print(f"paused {args.pause_at}", flush=True)
            while True:
                time.sleep(60)

    try:
        if args.restore:
            print(restore_journal(args.journal, backend, on_record=on_record).note, flush=True)
            return 0
        profile = load_profile(args.profile)
        index = None if args.gpu == "all" else int(args.gpu)
        if not args.hold:
            result = apply_profile(
                profile,
                backend,
                args.journal,
                index=index,
                cpu_root=args.cpu_root,
                on_record=on_record,
            )
            print(f"applied {len(result.applied)} change(s)", flush=True)
            return 0
        with profile_applied(
            profile,
            backend,
            args.journal,
            index=index,
            cpu_root=args.cpu_root,
            on_record=on_record,
        ) as result:
            print(f"holding {len(result.applied)} change(s)", flush=True)
            while True:
                time.sleep(60)
    except ApplyInterrupted as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

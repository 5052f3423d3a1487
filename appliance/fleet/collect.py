"""`autotune fleet collect`: bring each host's run directory back (over SFTP, regular files
only, never following links) into one local run directory, one folder per host, together with
a fresh `autotune host check` of the host."""

from __future__ import annotations

import json
import posixpath
import stat
from pathlib import Path

from appliance.fleet.commands import CHECK_TIMEOUT_S, autotune, run_dir
from appliance.fleet.connection import (
    SshOptions,
    command_timeout,
    open_connection,
    run_remote,
)
from appliance.fleet.inventory import Host
from appliance.fleet.parallel import HostResult

HOST_CHECK_FILE = "host-check.json"
MAX_FILES = 10_000


def collect_host(host: Host, opts: SshOptions, run_id: str | None, out: Path) -> HostResult:
    """Copy the host's run `run_id` (default: its latest) to out/<host name>/."""
    target = out / host.name
    target.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    with open_connection(host, opts) as conn:
        checked = run_remote(
            conn,
            host,
            [autotune(host), "host", "check", "--json"],
            command_timeout(host, opts, CHECK_TIMEOUT_S),
        )
        if checked.exit_code == 0 and checked.stdout.strip():
            (target / HOST_CHECK_FILE).write_text(checked.stdout)
        else:
            notes.append(f"host check failed (exit {checked.exit_code}); no {HOST_CHECK_FILE}")
        sftp = conn.sftp()
        wanted = run_dir(host, run_id or "latest")
        try:
            found = stat.S_ISDIR(sftp.stat(wanted).st_mode)
            source = sftp.normalize(wanted) if found else None
        except OSError:
            source = None
        files: list[str] = []
        if source is None:
            notes.append(f"no run directory {wanted} on the host (run fleet baseline or run)")
        else:
            files = _copy_tree(sftp, source, target / "run")
    data = {
        "dir": str(target),
        "run": posixpath.basename(source) if source else None,
        "files": files,
        "host_check": (target / HOST_CHECK_FILE).is_file(),
    }
    (target / "collect.json").write_text(json.dumps({"host": host.name, **data}, indent=2))
    return HostResult(host.name, "ok", f"{len(files)} file(s)", data=data, notes=notes)


def _copy_tree(sftp, source: str, target: Path) -> list[str]:
    copied: list[str] = []
    pending = [""]
    while pending and len(copied) < MAX_FILES:
        rel = pending.pop()
        remote = posixpath.join(source, rel) if rel else source
        for entry in sorted(sftp.listdir_attr(remote), key=lambda e: e.filename):
            name = entry.filename
            if name in (".", "..") or "/" in name:
                continue
            child = posixpath.join(rel, name) if rel else name
            if stat.S_ISDIR(entry.st_mode):
                pending.append(child)
            elif stat.S_ISREG(entry.st_mode):
                local = target / child
                local.parent.mkdir(parents=True, exist_ok=True)
                sftp.get(posixpath.join(source, child), str(local))
                copied.append(child)
    return sorted(copied)

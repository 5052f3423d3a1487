"""The remote side of `autotune fleet check|baseline|run`: the provisioned `autotune ... --json`
on each host, its JSON parsed, each failure kept with its reason."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from appliance.fleet.connection import (
    HostFailure,
    SshOptions,
    command_timeout,
    failure_from,
    open_connection,
    run_remote,
    run_script,
)
from appliance.fleet.inventory import Host
from appliance.fleet.parallel import HostResult

CHECK_TIMEOUT_S = 300.0
BASELINE_TIMEOUT_S = 1800.0
RUN_TIMEOUT_S = 24 * 3600.0
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

START_RUN = r"""
set -e
mkdir -p "$1/runs/$2"
ln -sfn "$2" "$1/runs/latest"
"""


@dataclass(frozen=True)
class RunOptions:
    """What `autotune fleet run` passes to every host's `autotune run`."""

    run_id: str
    store_url: str | None = None
    tasks: tuple[str, ...] = ()
    trials: int | None = None
    quick: bool = False
    device: str | None = None


def new_run_id() -> str:
    return datetime.now(UTC).strftime("fleet-%Y%m%d-%H%M%S")


def autotune(host: Host) -> str:
    return f"{host.dir}/bin/autotune"


def run_dir(host: Host, run_id: str) -> str:
    return f"{host.dir}/runs/{run_id}"


def check_host(host: Host, opts: SshOptions) -> HostResult:
    """`autotune host check --json` on the host."""
    argv = [autotune(host), "host", "check", "--json"]
    return _autotune_json(host, opts, argv, CHECK_TIMEOUT_S, "host check")


def baseline_host(
    host: Host, opts: SshOptions, run_id: str, quick: bool, device: str | None
) -> HostResult:
    """`autotune baseline --json`, its result also kept on the host for `fleet collect`."""
    argv = [
        autotune(host),
        "baseline",
        "--json",
        "--out",
        f"{run_dir(host, run_id)}/baseline.json",
        "--device",
        device or host.device,
    ]
    if quick:
        argv.append("--quick")
    return _autotune_json(host, opts, argv, BASELINE_TIMEOUT_S, "baseline", run_id=run_id)


def run_host(host: Host, opts: SshOptions, run: RunOptions) -> HostResult:
    """`autotune run` on the host into its run directory, every host on one store if given."""
    argv = [
        autotune(host),
        "run",
        "--out",
        run_dir(host, run.run_id),
        "--json",
        "--device",
        run.device or host.device,
    ]
    if run.store_url:
        argv += ["--store", run.store_url]
    for task in run.tasks:
        argv += ["--task", task]
    if run.trials is not None:
        argv += ["--trials", str(run.trials)]
    if run.quick:
        argv.append("--quick")
    return _autotune_json(host, opts, argv, RUN_TIMEOUT_S, "run", run_id=run.run_id)


def _autotune_json(
    host: Host,
    opts: SshOptions,
    argv: list[str],
    default_timeout: float,
    what: str,
    run_id: str | None = None,
) -> HostResult:
    timeout = command_timeout(host, opts, default_timeout)
    with open_connection(host, opts) as conn:
        if run_id is not None:
            started = run_script(conn, host, START_RUN, [host.dir, run_id], CHECK_TIMEOUT_S)
            if started.exit_code != 0:
                raise failure_from(started, "creating the run directory")
        done = run_remote(conn, host, argv, timeout)
    if done.exit_code == 127:
        raise HostFailure(
            "failed",
            f"autotune is not installed in {host.dir} (run `autotune fleet provision` first)",
            127,
        )
    data = _json(done.stdout)
    if done.exit_code != 0:
        failure = failure_from(done, f"autotune {what}")
        return HostResult(host.name, "failed", failure.reason, data=data, exit_code=done.exit_code)
    if data is None:
        raise HostFailure("failed", f"autotune {what} printed no JSON: {done.stdout[:200]!r}")
    notes = [f"run directory {run_dir(host, run_id)}"] if run_id else []
    return HostResult(host.name, "ok", "", data=data, exit_code=0, notes=notes)


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None

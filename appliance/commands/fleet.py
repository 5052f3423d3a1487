"""`autotune fleet ...`: provision, check, baseline, run and collect many hosts over SSH."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import click

from appliance.commands.options import DEVICE, JSON
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    UsageFailure,
    console,
    emit_json,
    ensure_writable_dir,
    out_console,
)

FLEET_EPILOG = (
    "Every host runs in its own thread; a host that is down, times out or fails is reported "
    "with its reason and the others go on (exit code 1 when any host failed). " + EXIT_CODES_HELP
)


def fleet_options(command: Callable) -> Callable:
    """--hosts, --limit, host key and time limit options, --json: shared by every subcommand."""
    options = [
        click.option(
            "--hosts",
            "hosts_file",
            required=True,
            type=click.Path(path_type=Path, dir_okay=False),
            help="The hosts file (TOML; see docs/fleet.md).",
        ),
        click.option(
            "--limit",
            "limits",
            multiple=True,
            metavar="TAG",
            help="Only hosts with this tag or name (repeatable).",
        ),
        click.option(
            "--known-hosts",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="known_hosts file for host keys [default: the hosts file's known_hosts, "
            "else ~/.ssh/known_hosts].",
        ),
        click.option(
            "--trust-new-host-keys",
            is_flag=True,
            help="Accept hosts not yet in known_hosts and record their keys (never a changed key).",
        ),
        click.option(
            "--connect-timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            metavar="SECONDS",
            help="Limit for connecting [default: the host's connect_timeout, else 10].",
        ),
        click.option(
            "--command-timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            metavar="SECONDS",
            help="Limit for each remote command [default: the host's command_timeout, "
            "else per command].",
        ),
        JSON,
    ]
    return functools.reduce(lambda cmd, option: option(cmd), reversed(options), command)


@click.group()
def fleet() -> None:
    """Drive many hosts over SSH: provision, check, baseline, run, collect (docs/fleet.md)."""


@fleet.command("provision", epilog=FLEET_EPILOG)
@fleet_options
@click.option(
    "--source",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The autotune checkout to ship [default: the one this command runs from].",
)
def fleet_provision(source: Path | None, **common) -> None:
    """Install this appliance on every host: Nix when the host has it, uv otherwise.

    A host that already has this exact source (by content hash) reports "no change".
    """
    from appliance.fleet.bundle import BundleError, build_bundle, default_source
    from appliance.fleet.provision import provision_host

    try:
        bundle = build_bundle((source or default_source()).resolve())
    except BundleError as exc:
        raise UsageFailure(str(exc)) from exc
    hosts, opts = _setup(common)
    if not common["as_json"]:
        console.print(f"shipping source {bundle.short} ({len(bundle.files)} files)")
    results = _each(hosts, lambda h: provision_host(h, bundle, opts), "provisioning", common)
    _finish("provision", results, common["as_json"], extra={"source_sha256": bundle.sha256})
    _exit_if_failed(results)


@fleet.command("check", epilog=FLEET_EPILOG)
@fleet_options
def fleet_check(**common) -> None:
    """Run `autotune host check` on every host; one table with the outliers flagged."""
    from appliance.fleet.commands import check_host
    from appliance.fleet.report import HostInput

    hosts, opts = _setup(common)
    results = _each(hosts, lambda h: check_host(h, opts), "checking", common)
    inputs = [
        HostInput(r.host, r.status, r.reason, check=r.data if r.ok else None) for r in results
    ]
    _finish("check", results, common["as_json"], report_inputs=inputs)
    _exit_if_failed(results)


@fleet.command("baseline", epilog=FLEET_EPILOG)
@fleet_options
@click.option("--quick", is_flag=True, help="Fewer samples (the CPU suite in seconds).")
@click.option(
    "--run-id", default=None, help="Run directory name on the hosts [default: a new one]."
)
@DEVICE
def fleet_baseline(quick: bool, run_id: str | None, device: str, **common) -> None:
    """Measure every host's baselines; bandwidths under 90 % of the fleet median are flagged."""
    from appliance.fleet.commands import baseline_host, new_run_id
    from appliance.fleet.report import HostInput

    run_id = _run_id(run_id) or new_run_id()
    hosts, opts = _setup(common)
    chosen = None if device == "auto" else device
    results = _each(
        hosts, lambda h: baseline_host(h, opts, run_id, quick, chosen), "measuring", common
    )
    inputs = [
        HostInput(r.host, r.status, r.reason, baseline=r.data if r.ok else None) for r in results
    ]
    _finish("baseline", results, common["as_json"], report_inputs=inputs, extra={"run_id": run_id})
    _exit_if_failed(results)


@fleet.command("run", epilog=FLEET_EPILOG)
@fleet_options
@click.option(
    "--store",
    "store_url",
    default=None,
    help="One experiment store for every host, e.g. postgresql+psycopg://user@db/autotune, "
    "so that the hosts search one study together [default: a SQLite file per host].",
)
@click.option("--task", "tasks", multiple=True, help="Task to tune (repeatable).")
@click.option("--trials", type=click.IntRange(1), default=None, help="Loop trials per task.")
@click.option("--quick", is_flag=True, help="Fewer timing blocks and a quick baseline suite.")
@click.option(
    "--run-id", default=None, help="Run directory name on the hosts [default: a new one]."
)
@DEVICE
def fleet_run(
    store_url: str | None,
    tasks: tuple[str, ...],
    trials: int | None,
    quick: bool,
    run_id: str | None,
    device: str,
    **common,
) -> None:
    """Run the whole pipeline (`autotune run`) on every host; `fleet collect` fetches the reports."""
    from appliance.fleet.commands import RunOptions, new_run_id, run_host
    from loop.tasks import TaskError, load_task

    for name in tasks:  # the hosts run this checkout's tasks: a typo fails here, not on each
        if name != "all":
            try:
                load_task(name)
            except TaskError as exc:
                raise UsageFailure(str(exc)) from exc

    run = RunOptions(
        run_id=_run_id(run_id) or new_run_id(),
        store_url=store_url,
        tasks=tasks,
        trials=trials,
        quick=quick,
        device=None if device == "auto" else device,
    )
    hosts, opts = _setup(common)
    results = _each(hosts, lambda h: run_host(h, opts, run), "running", common)
    _finish("run", results, common["as_json"], extra={"run_id": run.run_id, "store": store_url})
    _exit_if_failed(results)


@fleet.command("collect", epilog=FLEET_EPILOG)
@fleet_options
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("out/fleet"),
    show_default=True,
    help="Local run directory: one folder per host, plus fleet.json and fleet.md.",
)
@click.option("--run-id", default=None, help="Which run to fetch [default: each host's latest].")
def fleet_collect(out_dir: Path, run_id: str | None, **common) -> None:
    """Fetch every host's run directory and a fresh host check into one local run directory."""
    from appliance.fleet.collect import collect_host

    ensure_writable_dir(out_dir, "--out")
    chosen = _run_id(run_id)
    hosts, opts = _setup(common)
    results = _each(hosts, lambda h: collect_host(h, opts, chosen, out_dir), "collecting", common)
    inputs = [_collected_input(out_dir, r) for r in results]
    report = _finish(
        "collect", results, common["as_json"], report_inputs=inputs, extra={"out": str(out_dir)}
    )
    from appliance.fleet.report import render_markdown

    (out_dir / "fleet.json").write_text(
        json.dumps({"hosts": [r.to_dict() for r in results], "report": report.to_dict()}, indent=2)
    )
    (out_dir / "fleet.md").write_text(render_markdown(report))
    _exit_if_failed(results)


def _setup(common: dict):
    from appliance.fleet.connection import SshOptions
    from appliance.fleet.inventory import (
        DEFAULT_KNOWN_HOSTS,
        InventoryError,
        load_inventory,
        select_hosts,
    )

    try:
        inventory = load_inventory(common["hosts_file"])
        hosts = select_hosts(inventory, common["limits"])
    except InventoryError as exc:
        raise UsageFailure(str(exc)) from exc
    opts = SshOptions(
        known_hosts=common["known_hosts"] or inventory.known_hosts or DEFAULT_KNOWN_HOSTS,
        trust_new_host_keys=common["trust_new_host_keys"],
        connect_timeout=common["connect_timeout"],
        command_timeout=common["command_timeout"],
    )
    return hosts, opts


def _each(hosts, job, verb: str, common: dict):
    from appliance.fleet.parallel import for_each_host
    from appliance.progress import progress_bar

    if common["as_json"]:
        return for_each_host(hosts, job)
    progress = progress_bar()
    with progress:
        bar = progress.add_task(f"{verb} {len(hosts)} host(s)", total=len(hosts))

        def done(result) -> None:
            colour = "green" if result.ok else "red"
            progress.console.print(
                f"  {result.host}: [{colour}]{result.status}[/{colour}] {result.reason}"
            )
            progress.advance(bar)

        return for_each_host(hosts, job, on_done=done)


def _finish(command: str, results, as_json: bool, report_inputs=None, extra=None):
    from appliance.fleet.report import fleet_report, render_table

    report = fleet_report(report_inputs) if report_inputs is not None else None
    failed = [r for r in results if not r.ok]
    if as_json:
        emit_json(
            {
                "command": command,
                **(extra or {}),
                "ok": len(results) - len(failed),
                "failed": len(failed),
                "hosts": [r.to_dict() for r in results],
                **({"report": report.to_dict()} if report else {}),
            }
        )
    else:
        if report is not None:
            out_console.print(render_table(report, title=f"fleet {command}"))
        else:
            out_console.print(_status_table(command, results))
        for r in results:
            for note in r.notes:
                out_console.print(f"  {r.host}: {note}")
        out_console.print(f"{len(results) - len(failed)} ok, {len(failed)} failed")
    return report


def _exit_if_failed(results) -> None:
    if any(not r.ok for r in results):
        raise SystemExit(EXIT_REJECTED)


def _status_table(command: str, results):
    from rich.table import Table

    table = Table(title=f"fleet {command}")
    for col in ("host", "status", "reason", "seconds"):
        table.add_column(col, overflow="fold")
    for r in results:
        colour = "green" if r.ok else "red"
        table.add_row(r.host, f"[{colour}]{r.status}[/{colour}]", r.reason, f"{r.seconds:.1f}")
    return table


def _run_id(value: str | None) -> str | None:
    from appliance.fleet.commands import RUN_ID

    if value is not None and not RUN_ID.match(value):
        raise UsageFailure(f"--run-id {value!r}: use letters, digits, '.', '_' and '-' only")
    return value


def _collected_input(out: Path, result):
    from appliance.fleet.collect import HOST_CHECK_FILE
    from appliance.fleet.report import HostInput

    folder = out / result.host
    check = _read_json(folder / HOST_CHECK_FILE)
    baseline = _read_json(folder / "run" / "baseline.json")
    if baseline is None:
        report = _read_json(folder / "run" / "report.json") or {}
        baseline = report.get("baselines")
    return HostInput(result.host, result.status, result.reason, check=check, baseline=baseline)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None

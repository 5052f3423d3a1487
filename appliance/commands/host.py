"""`autotune host ...`: read and check the host, list, apply and restore profiles."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.commands.options import (
    JOURNAL,
    JSON,
)
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    UsageFailure,
    console,
    emit_json,
    ensure_writable_dir,
    out_console,
)


@click.group()
def host() -> None:
    """Read and check the host: PCIe, NUMA, CPU governor, GPU settings."""


@host.command("check", epilog=EXIT_CODES_HELP)
@JSON
def host_check(as_json: bool) -> None:
    """Facts and checks, each with status, actual and recommended value and how to fix it."""
    from host_tuning.report import host_report, render_checks_table

    report = host_report()
    if as_json:
        emit_json(report)
        return
    out_console.print(report["note"])
    out_console.print(render_checks_table(report["checks"]))


@host.command("profiles")
@JSON
def host_profiles(as_json: bool) -> None:
    """List the shipped clock/power profiles."""
    from host_tuning.apply import render_profiles_table
    from host_tuning.profiles import list_profiles

    profiles = list_profiles()
    if as_json:
        emit_json([{"name": p.name, "description": p.description} for p in profiles])
    else:
        out_console.print(render_profiles_table(profiles))


SIMULATE = click.option(
    "--simulate",
    metavar="FIXTURE",
    default=None,
    help="Use a simulated GPU built from recorded facts (h200, rtx4090) and a copy of the CPU "
    "frequency files under --sim-dir: the apply/restore path without changing this machine.",
)
SIM_DIR = click.option(
    "--sim-dir",
    type=click.Path(path_type=Path),
    default=Path(".autotune/simulated"),
    show_default=True,
    help="Where --simulate keeps the simulated device's state and CPU files.",
)


def _backend(simulate: str | None, sim_dir: Path, writable: bool, fresh_cpu: bool):
    """The NVML backend and CPU sysfs root to act on: the real ones, or the simulated pair."""
    from host_tuning.fact import REAL_ROOT
    from host_tuning.nvml import probe_nvml

    if simulate is None:
        return probe_nvml(writable=writable).backend, REAL_ROOT
    from appliance.tuned_host import simulated_device

    ensure_writable_dir(sim_dir, "--sim-dir")
    return simulated_device(simulate, sim_dir / "nvml-state.jsonl", sim_dir / "host", fresh_cpu)


@host.command("apply", epilog=EXIT_CODES_HELP)
@click.argument("profile")
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Really change the host (root); without it, a dry run.",
)
@JOURNAL
@SIMULATE
@SIM_DIR
@JSON
def host_apply(
    profile: str,
    do_apply: bool,
    journal: Path | None,
    simulate: str | None,
    sim_dir: Path,
    as_json: bool,
) -> None:
    """Plan PROFILE (a shipped name or a .json file) and print the diff; --apply performs it.

    Every change is journaled before it is made and read back after; `autotune host restore`
    undoes a journal that a killed process left open.
    """
    from host_tuning.apply import USER_ERRORS, apply_profile, render_plan_table
    from host_tuning.journal import default_journal_path
    from host_tuning.profiles import ProfileError, load_profile, plan

    try:
        chosen = load_profile(profile)
    except ProfileError as exc:
        raise UsageFailure(str(exc)) from exc
    backend, cpu_root = _backend(simulate, sim_dir, writable=do_apply, fresh_cpu=True)
    try:
        changes = plan(chosen, backend, None, cpu_root=cpu_root)
        result = (
            apply_profile(
                chosen, backend, journal or default_journal_path(), index=None, cpu_root=cpu_root
            )
            if do_apply
            else None
        )
    except USER_ERRORS as exc:
        console.print(f"[red]refused[/red]: {exc}")
        if simulate and getattr(exc, "needs_restore", False):
            console.print(
                f"(on the simulated device: add --simulate {simulate} --sim-dir {sim_dir})"
            )
        raise SystemExit(getattr(exc, "exit_code", EXIT_REJECTED)) from exc
    if result is not None:
        changes = result.changes  # as they ended: applied, skipped or failed
    if as_json:
        emit_json(
            {
                "profile": chosen.name,
                "applied": do_apply,
                "changes": [c.to_dict() for c in changes],
                "journal": str(result.journal) if result else None,
            }
        )
        return
    out_console.print(render_plan_table(changes))
    if result is None:
        out_console.print("dry run: nothing changed (add --apply, as root, to perform it)")
    else:
        sim = f" --simulate {simulate} --sim-dir {sim_dir}" if simulate else ""
        out_console.print(
            f"applied; undo with: autotune host restore --journal {result.journal}{sim}"
        )


@host.command("restore", epilog=EXIT_CODES_HELP)
@JOURNAL
@click.option("--force", is_flag=True, help="Restore even while the process that applied is alive.")
@SIMULATE
@SIM_DIR
@JSON
def host_restore(
    journal: Path | None, force: bool, simulate: str | None, sim_dir: Path, as_json: bool
) -> None:
    """Undo the changes an open journal holds, last first (after a crash or a kill)."""
    from host_tuning.apply import USER_ERRORS, restore_journal
    from host_tuning.journal import default_journal_path

    path = journal or default_journal_path()
    if journal is not None and not journal.exists():
        raise UsageFailure(f"--journal {journal}: no such file")
    try:
        backend, _ = _backend(simulate, sim_dir, writable=True, fresh_cpu=False)
        result = restore_journal(path, backend, force=force)
    except USER_ERRORS as exc:
        console.print(f"[red]not restored[/red]: {exc}")
        raise SystemExit(getattr(exc, "exit_code", EXIT_REJECTED)) from exc
    if as_json:
        emit_json({"journal": str(path), "note": result.note})
    else:
        out_console.print(result.note)

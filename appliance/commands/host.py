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
    console.print(report["note"])
    console.print(render_checks_table(report["checks"]))


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
        console.print(render_profiles_table(profiles))


@host.command("apply", epilog=EXIT_CODES_HELP)
@click.argument("profile")
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Really change the host (root); without it, a dry run.",
)
@JOURNAL
@JSON
def host_apply(profile: str, do_apply: bool, journal: Path | None, as_json: bool) -> None:
    """Plan PROFILE (a shipped name or a .json file) and print the diff; --apply performs it.

    Every change is journaled before it is made and read back after; `autotune host restore`
    undoes a journal that a killed process left open.
    """
    from host_tuning.apply import USER_ERRORS, apply_profile, render_plan_table
    from host_tuning.journal import default_journal_path
    from host_tuning.nvml import probe_nvml
    from host_tuning.profiles import ProfileError, load_profile, plan

    try:
        chosen = load_profile(profile)
    except ProfileError as exc:
        raise UsageFailure(str(exc)) from exc
    backend = probe_nvml(writable=do_apply).backend
    try:
        changes = plan(chosen, backend, None)
        result = (
            apply_profile(chosen, backend, journal or default_journal_path(), index=None)
            if do_apply
            else None
        )
    except USER_ERRORS as exc:
        console.print(f"[red]refused[/red]: {exc}")
        raise SystemExit(getattr(exc, "exit_code", EXIT_REJECTED)) from exc
    if as_json:
        emit_json(
            {
                "profile": chosen.name,
                "applied": do_apply,
                "changes": [c.to_dict() for c in changes],
                "journal": str(result.journal_path) if result else None,
            }
        )
        return
    console.print(render_plan_table(changes))
    if result is None:
        console.print("dry run: nothing changed (add --apply, as root, to perform it)")
    else:
        console.print(f"applied; undo with: autotune host restore --journal {result.journal_path}")


@host.command("restore", epilog=EXIT_CODES_HELP)
@JOURNAL
@click.option("--force", is_flag=True, help="Restore even while the process that applied is alive.")
@JSON
def host_restore(journal: Path | None, force: bool, as_json: bool) -> None:
    """Undo the changes an open journal holds, last first (after a crash or a kill)."""
    from host_tuning.apply import USER_ERRORS, restore_journal
    from host_tuning.journal import default_journal_path
    from host_tuning.nvml import probe_nvml

    path = journal or default_journal_path()
    try:
        result = restore_journal(path, probe_nvml(writable=True).backend, force=force)
    except USER_ERRORS as exc:
        console.print(f"[red]not restored[/red]: {exc}")
        raise SystemExit(getattr(exc, "exit_code", EXIT_REJECTED)) from exc
    if as_json:
        emit_json({"journal": str(path), "note": result.note})
    else:
        console.print(result.note)

"""`autotune run`: the whole pipeline (host check, profile plan, baselines, loop, report); with
--apply the profile is applied for interleaved tuned blocks and the report holds the gains."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.commands.options import (
    DEVICE,
    JSON,
)
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    emit_json,
)


@click.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("out"),
    show_default=True,
    help="Run directory for report.json, report.md, results and dispatch tables.",
)
@click.option(
    "--task",
    "tasks",
    multiple=True,
    help="Task to tune (repeatable; `all` for every task) [default: rmsnorm].",
)
@click.option(
    "--trials",
    type=click.IntRange(1),
    default=None,
    help="Loop trials per task [default: 6 on CPU, 18 on GPU].",
)
@click.option(
    "--store",
    "store_url",
    default=None,
    help="Experiment store URL [default: sqlite file in the run directory].",
)
@click.option(
    "--profile",
    default="stable",
    show_default=True,
    help="Host profile to plan (a dry run unless --apply).",
)
@click.option(
    "--apply",
    "do_apply",
    is_flag=True,
    help="Apply the profile (root and the NVIDIA driver, or --simulate) for the gains stage: "
    "stock and tuned host interleaved, restored after each tuned block and on exit, error, "
    "SIGINT or SIGTERM.",
)
@click.option(
    "--simulate",
    metavar="FIXTURE",
    default=None,
    help="With --apply: apply the profile to a simulated NVML device (h200, rtx4090, or a "
    "fixture file) instead of the GPU; nothing on the host changes.",
)
@click.option(
    "--gain-rounds",
    type=click.IntRange(1),
    default=None,
    help="Host-state rounds (stock, tuned) of the gains stage [default: 2 on CPU or --quick, "
    "else 3].",
)
@click.option(
    "--quick", is_flag=True, help="Fewer timing blocks per decision and a quick baseline suite."
)
@click.option(
    "--keep-ids",
    is_flag=True,
    help="Keep GPU serial numbers and UUIDs in the report (redacted by default).",
)
@DEVICE
@JSON
def run(
    out_dir: Path,
    tasks: tuple[str, ...],
    trials: int | None,
    store_url: str | None,
    profile: str,
    do_apply: bool,
    simulate: str | None,
    gain_rounds: int | None,
    quick: bool,
    keep_ids: bool,
    device: str,
    as_json: bool,
) -> None:
    """Run the whole pipeline: host check, profile plan (dry run), baselines, loop, report.

    With --apply: pre-flight, then after the loop the gains stage (hardware, kernel and end-to-end
    gains, each one interleaved measurement), the profile restored afterwards."""
    from appliance.pipeline import PipelineConfig, run_pipeline
    from host_tuning.apply import ApplyInterrupted

    cfg = PipelineConfig(
        out_dir=out_dir,
        tasks=list(tasks),
        trials=trials,
        store_url=store_url,
        profile=profile,
        device=device,
        quick=quick,
        keep_ids=keep_ids,
        apply=do_apply,
        simulate=simulate,
        gain_rounds=gain_rounds,
    )
    try:
        result = run_pipeline(cfg, quiet=as_json)
    except ApplyInterrupted as exc:
        click.echo(f"interrupted: {exc}", err=True)
        raise SystemExit(exc.exit_code) from None
    if as_json:
        summary = {
            "report": str(result.report_json),
            "markdown": str(result.report_md),
            "html": str(result.report_md.with_suffix(".html")),
            "valid": not result.errors,
            "errors": result.errors,
        }
        if do_apply:
            summary |= _applied_summary(result.report)
        emit_json(summary)
    else:
        html = result.report_md.with_suffix(".html")
        click.echo(f"report: {result.report_json}\nmarkdown: {result.report_md}\nhtml: {html}")
    if result.restored is False:
        journal = result.report["profile"].get("journal")
        click.echo(
            f"error: the profile was NOT fully restored; see the journal {journal}", err=True
        )
    if result.errors or result.restored is False:
        raise SystemExit(EXIT_REJECTED)


def _applied_summary(report: dict) -> dict:
    """What --json adds with --apply: the profile's state and the headline gains."""
    profile = report["profile"]
    gains = report.get("gains") or {}
    e2e = gains.get("end_to_end") or {}
    return {
        "profile": {k: profile.get(k) for k in ("name", "mode", "restored", "journal", "nvml")},
        "gains": {
            "hardware": _ratio(gains.get("hardware")),
            "kernel": _ratio(gains.get("kernel")),
            "end_to_end": _ratio(e2e.get("combined")),
        },
    }


def _ratio(gain: dict | None) -> dict | None:
    return None if not gain else {k: gain[k] for k in ("ratio", "ci_low", "ci_high")}

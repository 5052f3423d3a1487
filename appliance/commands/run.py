"""`autotune run`: the whole pipeline (host check, profile plan, baselines, loop, report)."""

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
    "--profile", default="stable", show_default=True, help="Host profile to plan (dry run)."
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
    quick: bool,
    keep_ids: bool,
    device: str,
    as_json: bool,
) -> None:
    """Run the whole pipeline: host check, profile plan (dry run), baselines, loop, report."""
    from appliance.pipeline import PipelineConfig, run_pipeline

    cfg = PipelineConfig(
        out_dir=out_dir,
        tasks=list(tasks),
        trials=trials,
        store_url=store_url,
        profile=profile,
        device=device,
        quick=quick,
        keep_ids=keep_ids,
    )
    result = run_pipeline(cfg, quiet=as_json)
    if as_json:
        emit_json(
            {
                "report": str(result.report_json),
                "markdown": str(result.report_md),
                "html": str(result.report_md.with_suffix(".html")),
                "valid": not result.errors,
                "errors": result.errors,
            }
        )
    else:
        html = result.report_md.with_suffix(".html")
        click.echo(f"report: {result.report_json}\nmarkdown: {result.report_md}\nhtml: {html}")
    if result.errors:
        raise SystemExit(EXIT_REJECTED)

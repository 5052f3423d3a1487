"""`autotune loop`: the autoresearch loop over one task."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.commands.options import (
    DEVICE,
    JSON,
    candidate_args,
    check_shapes,
    chosen_peers,
)
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    UsageFailure,
    console,
    emit_json,
    ensure_writable_dir,
)


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("task")
@click.option(
    "--candidate",
    default=None,
    help="Candidate file whose PARAMS to search [default: the task's first for the device].",
)
@click.option(
    "--trials",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Total trials in the study (a resumed loop counts earlier ones).",
)
@click.option(
    "--store",
    "store_url",
    default=None,
    help="Store URL: sqlite:///path or postgresql://... [default: .autotune/experiments.sqlite3].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path(".autotune"),
    show_default=True,
    help="Where results.tsv and the dispatch table go.",
)
@click.option("--peer", "peers", multiple=True, help="Peers for the final comparison (repeatable).")
@click.option(
    "--min-effect",
    type=float,
    default=0.005,
    show_default=True,
    help="Smallest speedup worth keeping (on top of the A/A noise floor).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the study in the store (the default when it exists; kept for clarity).",
)
@click.option(
    "--shape", "shapes", multiple=True, help="Only these shapes (repeatable) [default: all]."
)
@click.option("--quick", is_flag=True, help="Fewer timing blocks per decision (wider intervals).")
@DEVICE
@JSON
def loop(
    task: str,
    candidate: str | None,
    trials: int,
    store_url: str | None,
    out_dir: Path,
    peers: tuple[str, ...],
    min_effect: float,
    resume: bool,
    shapes: tuple[str, ...],
    quick: bool,
    device: str,
    as_json: bool,
) -> None:
    """Search a candidate's PARAMS with Optuna, keeping only measured, significant wins."""
    from appliance.devices import resolve_device
    from appliance.progress import loop_progress
    from loop.driver import QUICK_RULE, LoopConfig, LoopError, run_loop
    from loop.store import StoreError, default_store_url

    the_task, spec = candidate_args(task, candidate or _default_candidate(task, device), None)
    dev, note = resolve_device(device)
    ensure_writable_dir(out_dir, "--out")
    check_shapes(the_task, dev, shapes)
    cfg = LoopConfig(
        the_task,
        spec.path,
        dev,
        trials,
        store_url or default_store_url(out_dir),
        out_dir,
        peers=chosen_peers(the_task, dev, peers),
        min_effect=min_effect,
        rule=QUICK_RULE if quick else {},
        shapes=list(shapes) or None,
    )
    try:
        with loop_progress(quiet=as_json, note=note) as on_event:
            result = run_loop(cfg, on_event)
    except StoreError as exc:
        raise UsageFailure(str(exc)) from exc
    except LoopError as exc:
        console.print(f"[red]loop stopped[/red]: {exc}")
        raise SystemExit(EXIT_REJECTED) from exc
    if as_json:
        emit_json(result.to_dict())
    else:
        from appliance.progress import render_final_table

        console.print(render_final_table(result))
        console.print(f"stopped: {result.stop_reason}; results: {out_dir / 'results.tsv'}")


def _default_candidate(task_name: str, device: str) -> str:
    from appliance.devices import resolve_device
    from loop.tasks import TaskError, load_task

    try:
        task = load_task(task_name)
    except TaskError as exc:
        raise UsageFailure(str(exc)) from exc
    paths = task.candidate_paths(resolve_device(device)[0])
    if not paths:
        raise UsageFailure(f"task {task.name} ships no candidate for this device; give --candidate")
    return str(paths[0])

"""`autotune verify` and `autotune bench`: one candidate through the evaluator."""

from __future__ import annotations

import click

from appliance.commands.options import (
    DEVICE,
    JSON,
    PREFLIGHT,
    candidate_args,
    check_shapes,
    chosen_peers,
    print_verdict,
    reason_codes_epilog,
    run_preflight,
)
from appliance.output import (
    EXIT_REJECTED,
    emit_json,
    fmt_time,
    out_console,
)


@click.command(epilog=reason_codes_epilog())
@click.argument("task")
@click.argument("candidate")
@click.option(
    "--params", default=None, help="Parameters as a JSON object, from the candidate's PARAMS."
)
@DEVICE
@JSON
def verify(task: str, candidate: str, params: str | None, device: str, as_json: bool) -> None:
    """Check CANDIDATE against TASK's reference on every shape; exit 0 if accepted, 1 if not.

    TASK is a task name (see `autotune tasks`) or a task folder; CANDIDATE a file path, or the
    name of a file in the task folder.
    """
    _prestart(device)
    from appliance.devices import resolve_device
    from loop.evaluator import evaluate

    the_task, spec = candidate_args(task, candidate, params)
    dev, _ = resolve_device(device)
    ev = evaluate(the_task, [spec], dev)
    verdict = ev.by_label("candidate")
    data = {
        **verdict.to_dict(),
        "task": the_task.name,
        "candidate": str(spec.path),
        "device": dev,
        "seconds": ev.seconds,
    }
    print_verdict(data, as_json)
    if not verdict.accepted:
        raise SystemExit(EXIT_REJECTED)


@click.command(epilog=reason_codes_epilog())
@click.argument("task")
@click.argument("candidate")
@click.option(
    "--params", default=None, help="Parameters as a JSON object, from the candidate's PARAMS."
)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    help="Peer to time alongside (repeatable); default: all on GPU, eager on CPU.",
)
@click.option("--shape", "shapes", multiple=True, help="Only these shapes (repeatable).")
@PREFLIGHT
@DEVICE
@JSON
def bench(
    task: str,
    candidate: str,
    params: str | None,
    peers: tuple[str, ...],
    shapes: tuple[str, ...],
    preflight: str,
    device: str,
    as_json: bool,
) -> None:
    """Verify CANDIDATE, then time it against the peers, interleaved, shape by shape."""
    _prestart(device)
    from appliance.devices import resolve_device
    from baselines.stats import ratio_interval
    from loop.dispatch import source_sha256
    from loop.evaluator import evaluate

    the_task, spec = candidate_args(task, candidate, params)
    benched_sha256 = source_sha256(spec.path)
    dev, _ = resolve_device(device)
    chosen = chosen_peers(the_task, dev, peers)
    check_shapes(the_task, dev, shapes)
    preflight_seen = run_preflight(dev, preflight)
    ev = evaluate(the_task, [spec], dev, time_it=True, peers=chosen, shapes=list(shapes) or None)
    verdict = ev.by_label("candidate")
    rows = []
    for name, result in verdict.shapes.items():
        row = {
            "shape": name,
            "candidate_s": result.median_s,
            "peers": {
                v.label: v.shapes[name].median_s
                for v in ev.verdicts
                if v.kind == "peer" and name in v.shapes
            },
        }
        best = ev.best_peer(name)
        if best and result.blocks_s:
            interval = ratio_interval(best.shapes[name].blocks_s, result.blocks_s)
            row["best_peer"] = best.label
            row["speedup_vs_best_peer"] = interval.to_dict()
        rows.append(row)
    data = {
        **verdict.to_dict(),
        "task": the_task.name,
        "candidate": str(spec.path),
        "candidate_sha256": benched_sha256,
        "device": dev,
        "ceilings": ev.ceilings,
        "table": rows,
        "peer_verdicts": [v.to_dict() for v in ev.verdicts if v.kind == "peer"],
        "preflight": preflight_seen,
        "seconds": ev.seconds,
    }
    if as_json:
        emit_json(data)
    else:
        print_verdict(data, False)
        from rich.table import Table

        table = Table(title=f"{the_task.name}: {spec.path.name} {spec.params or ''}")
        for col in ("shape", "candidate", *chosen, "speedup vs best peer [95% CI]"):
            table.add_column(col)
        for row in rows:
            sp = row.get("speedup_vs_best_peer")
            text = (
                f"{sp['ratio']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}] vs {row['best_peer']}"
                if sp
                else "-"
            )
            table.add_row(
                row["shape"],
                fmt_time(row["candidate_s"]),
                *[fmt_time(row["peers"].get(p)) for p in chosen],
                text,
            )
        out_console.print(table)
    if not verdict.accepted:
        raise SystemExit(EXIT_REJECTED)


def _prestart(device: str) -> None:
    """Start the evaluator's worker first thing, so its imports (seconds) overlap this
    command's own; with --device auto the device is not known yet, so nothing starts early."""
    if device in ("cpu", "cuda"):
        from loop.worker_pool import prestart_worker

        prestart_worker(device)

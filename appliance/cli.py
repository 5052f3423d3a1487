"""The `autotune` command line (click). Each stage of the pipeline is a subcommand; with no
subcommand, `autotune` is `autotune run`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from appliance import __version__
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    UsageFailure,
    console,
    emit_json,
    ensure_writable_dir,
    fmt_time,
)

DEVICE = click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="Where kernels run; auto picks the GPU when torch sees one.",
)
JSON = click.option(
    "--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout."
)


@click.group(invoke_without_command=True, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="autotune")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Check the host, measure its baselines, tune kernels and write a speedup report.

    With no command, runs the whole pipeline (`autotune run`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(run)


# ---------------------------------------------------------------- run


@main.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=Path("out"),
    show_default=True,
    help="Run directory for report.json, report.md, results and dispatch tables.",
)
@click.option(
    "--task", "tasks", multiple=True, help="Task to tune (repeatable); default: every task."
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
@DEVICE
@JSON
def run(
    out_dir: Path,
    tasks: tuple[str, ...],
    trials: int | None,
    store_url: str | None,
    profile: str,
    quick: bool,
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
    )
    result = run_pipeline(cfg, quiet=as_json)
    if as_json:
        emit_json(
            {
                "report": str(result.report_json),
                "markdown": str(result.report_md),
                "valid": not result.errors,
                "errors": result.errors,
            }
        )
    else:
        click.echo(f"report: {result.report_json}\nmarkdown: {result.report_md}")
    if result.errors:
        raise SystemExit(EXIT_REJECTED)


# ---------------------------------------------------------------- host


@main.group()
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


JOURNAL = click.option(
    "--journal",
    type=click.Path(path_type=Path),
    default=None,
    help="Journal file [default: /run/autotune/host-journal.jsonl as root, else under ~/.local/state].",
)


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


# ---------------------------------------------------------------- baseline


@main.group(invoke_without_command=True, epilog=EXIT_CODES_HELP)
@click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the JSON result here.",
)
@click.option("--quick", is_flag=True, help="Fewer samples (the CPU suite in seconds).")
@DEVICE
@JSON
@click.pass_context
def baseline(
    ctx: click.Context, out_file: Path | None, quick: bool, device: str, as_json: bool
) -> None:
    """Measure the host's baselines: bandwidths, GEMM rate, launch latency, graph replay."""
    if ctx.invoked_subcommand is not None:
        return
    from appliance.devices import resolve_device
    from baselines.suite import render_result, run_suite

    dev, note = resolve_device(device)
    if not as_json:
        console.print(note)
    result = run_suite(
        dev, quick=quick, progress=None if as_json else lambda m: console.print(f"  {m}")
    )
    data = result.to_dict()
    if out_file is not None:
        _write_json(out_file, data)
    if as_json:
        emit_json(data)
    else:
        console.print(render_result(result))


@baseline.command("compare", epilog=EXIT_CODES_HELP)
@click.argument("a")
@click.argument("b")
@JSON
def baseline_compare(a: str, b: str, as_json: bool) -> None:
    """Per-metric ratios of two baselines (for example bare metal against a VM).

    A and B are files written by `autotune baseline --out`, or the name of a shipped reference
    (`h200-kvm-passthrough`: the lent H200, a KVM guest with the GPU passed through).
    """
    from baselines.compare import compare_baselines, read_baseline, render_comparison

    try:
        cmp = compare_baselines(read_baseline(a), read_baseline(b))
    except ValueError as exc:
        raise UsageFailure(str(exc)) from exc
    if as_json:
        emit_json(cmp.to_dict())
    else:
        console.print(render_comparison(cmp))
        console.print(cmp.summary)


# ---------------------------------------------------------------- verify / bench


def _candidate_args(task_name: str, candidate: str, params: str | None):
    from loop.evaluator import CandidateSpec
    from loop.tasks import TaskError, load_task

    try:
        task = load_task(task_name)
    except TaskError as exc:
        raise UsageFailure(str(exc)) from exc
    path = Path(candidate)
    if not path.exists() and (task.folder / candidate).exists():
        path = task.folder / candidate
    if not path.is_file():
        raise UsageFailure(
            f"candidate {candidate!r} is not a file (nor a file of task {task.name})"
        )
    try:
        parsed = json.loads(params) if params else {}
    except json.JSONDecodeError as exc:
        raise UsageFailure(f"--params is not JSON: {exc.msg} at column {exc.colno}") from exc
    if not isinstance(parsed, dict):
        raise UsageFailure("--params must be a JSON object, for example '{\"num_warps\": 8}'")
    return task, CandidateSpec(path.resolve(), parsed, "candidate")


def _reason_codes_epilog() -> str:
    from loop.reasons import codes_help

    return "\b\nReason codes:\n" + codes_help() + "\n\n" + EXIT_CODES_HELP


@main.command(epilog=_reason_codes_epilog())
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
    from appliance.devices import resolve_device
    from loop.evaluator import evaluate

    the_task, spec = _candidate_args(task, candidate, params)
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
    _print_verdict(data, as_json)
    if not verdict.accepted:
        raise SystemExit(EXIT_REJECTED)


@main.command(epilog=_reason_codes_epilog())
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
@DEVICE
@JSON
def bench(
    task: str,
    candidate: str,
    params: str | None,
    peers: tuple[str, ...],
    shapes: tuple[str, ...],
    device: str,
    as_json: bool,
) -> None:
    """Verify CANDIDATE, then time it against the peers, interleaved, shape by shape."""
    from appliance.devices import resolve_device
    from baselines.stats import ratio_interval
    from loop.evaluator import evaluate

    the_task, spec = _candidate_args(task, candidate, params)
    dev, _ = resolve_device(device)
    chosen = _peers(the_task, dev, peers)
    _check_shapes(the_task, dev, shapes)
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
        "device": dev,
        "ceilings": ev.ceilings,
        "table": rows,
        "peer_verdicts": [v.to_dict() for v in ev.verdicts if v.kind == "peer"],
        "seconds": ev.seconds,
    }
    if as_json:
        emit_json(data)
    else:
        _print_verdict(data, False)
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
        console.print(table)
    if not verdict.accepted:
        raise SystemExit(EXIT_REJECTED)


def _check_shapes(task, device: str, shapes: tuple[str, ...]) -> None:
    known = {s.name for s in task.shapes(device)}
    unknown = [s for s in shapes if s not in known]
    if unknown:
        raise UsageFailure(
            f"unknown shape(s) {unknown}; {task.name} on {device} has {sorted(known)}"
        )


def _peers(task, device: str, asked: tuple[str, ...]) -> list[str]:
    available = list(task.peers)
    if asked:
        unknown = [p for p in asked if p not in available]
        if unknown:
            raise UsageFailure(f"unknown peer(s) {unknown}; {task.name} has {available}")
        return list(asked)
    return task.default_peers(device)


def _print_verdict(data: dict, as_json: bool) -> None:
    if as_json:
        emit_json(data)
        return
    colour = "green" if data["verdict"] == "accepted" else "red"
    console.print(
        f"[{colour}]{data['verdict']}[/{colour}] {data['candidate']} {data.get('params') or ''} on {data['device']}"
    )
    for r in data["reasons"]:
        console.print(f"  {r['code']}: {r['message']}")


# ---------------------------------------------------------------- loop


@main.command(epilog=EXIT_CODES_HELP)
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

    the_task, spec = _candidate_args(task, candidate or _default_candidate(task, device), None)
    dev, note = resolve_device(device)
    ensure_writable_dir(out_dir, "--out")
    _check_shapes(the_task, dev, shapes)
    cfg = LoopConfig(
        the_task,
        spec.path,
        dev,
        trials,
        store_url or default_store_url(out_dir),
        out_dir,
        peers=_peers(the_task, dev, peers),
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


# ---------------------------------------------------------------- report


@main.group()
def report() -> None:
    """Validate and render speedup reports."""


@report.command("validate", epilog=EXIT_CODES_HELP)
@click.argument("file", type=click.Path(path_type=Path))
@JSON
def report_validate(file: Path, as_json: bool) -> None:
    """Check FILE against the report JSON Schema; name every failing path."""
    from appliance.report import validate_file

    errors = [str(e) for e in validate_file(file)]
    if as_json:
        emit_json({"file": str(file), "valid": not errors, "errors": errors})
    elif errors:
        console.print(f"[red]invalid[/red] {file}")
        for e in errors:
            console.print(f"  {e}")
    else:
        console.print(f"[green]valid[/green] {file}")
    if errors:
        raise SystemExit(EXIT_REJECTED)


# ---------------------------------------------------------------- tasks


@main.command()
@JSON
def tasks(as_json: bool) -> None:
    """List the kernel tasks, their shapes, peers and shipped candidates."""
    from loop.tasks import available_tasks, load_task

    rows = []
    for name in available_tasks():
        t = load_task(name)
        rows.append(
            {
                "task": name,
                "folder": str(t.folder),
                "peers": list(t.peers),
                "candidates": t.candidates,
                "shapes": {d: [s.name for s in t.shapes(d)] for d in ("cuda", "cpu")},
            }
        )
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        click.echo(
            f"{row['task']}: peers {', '.join(row['peers'])}; candidates {row['candidates']}; {len(row['shapes']['cuda'])} GPU / {len(row['shapes']['cpu'])} CPU shapes"
        )


# ---------------------------------------------------------------- helpers


def _write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
    except OSError as exc:
        raise UsageFailure(f"cannot write {path}: {exc.strerror}") from exc

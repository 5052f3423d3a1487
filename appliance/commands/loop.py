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
    out_console,
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
    help="Store URL: sqlite:///path or postgresql://... [default: experiments.sqlite3 under --out].",
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
    help="Continue the study in the store after a stop or a kill (the default when it exists).",
)
@click.option(
    "--shape", "shapes", multiple=True, help="Only these shapes (repeatable) [default: all]."
)
@click.option("--quick", is_flag=True, help="Fewer timing blocks per decision (wider intervals).")
@click.option(
    "--proposer",
    type=click.Choice(["search", "scripted", "agent"]),
    default="search",
    show_default=True,
    help="search: Optuna over PARAMS; scripted: replay --script; agent: run --agent-command.",
)
@click.option(
    "--script",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of steps (*.py candidate files, *.patch/*.diff patches) for --proposer scripted.",
)
@click.option(
    "--agent-command",
    default=None,
    help="Agent command line for --proposer agent, with {brief} and {workspace} placeholders.",
)
@click.option(
    "--agent-timeout",
    type=click.FloatRange(min=1),
    default=1800.0,
    show_default=True,
    help="Seconds one agent call may take.",
)
@click.option("--idea", "ideas", multiple=True, help="An idea for the agent's brief (repeatable).")
@click.option(
    "--ideas-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Ideas for the brief, one per paragraph.",
)
@click.option(
    "--goal-speedup",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop once the incumbent is this many times faster than the best peer (geomean).",
)
@click.option(
    "--goal-roofline",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="Stop once the incumbent reaches this fraction of the roofline (GPU only).",
)
@click.option(
    "--time-budget",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop after this many seconds.",
)
@click.option(
    "--agent-calls", type=click.IntRange(1), default=None, help="Stop after N agent calls."
)
@click.option(
    "--plateau",
    type=click.IntRange(1),
    default=None,
    help="Stop after N experiments in a row without a keep.",
)
@click.option(
    "--noise-floor",
    type=click.FloatRange(min=0),
    default=None,
    help="Use this noise floor (e.g. 0.02) instead of measuring it with an A/A run.",
)
@click.option(
    "--no-final",
    is_flag=True,
    help="Skip the final comparison against the peers (and the dispatch table).",
)
@click.option("--study", default=None, help="Study name in the store [default: from the task].")
@click.option(
    "--sampler",
    type=click.Choice(["auto", "grid", "tpe", "gp", "random"]),
    default="auto",
    show_default=True,
    help="Optuna sampler for --proposer search (auto: grid up to 64 configurations, TPE above).",
)
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
    proposer: str,
    script: Path | None,
    agent_command: str | None,
    agent_timeout: float,
    ideas: tuple[str, ...],
    ideas_file: Path | None,
    goal_speedup: float | None,
    goal_roofline: float | None,
    time_budget: float | None,
    agent_calls: int | None,
    plateau: int | None,
    noise_floor: float | None,
    no_final: bool,
    study: str | None,
    sampler: str,
    device: str,
    as_json: bool,
) -> None:
    """The autoresearch loop: propose (search, scripted or agent), check the workspace lock,
    verify, measure against the incumbent, keep (a commit) or revert, until a goal, a budget or
    a plateau. Killed at any point, it continues where it stopped (--resume)."""
    from appliance.devices import resolve_device
    from appliance.progress import loop_progress
    from loop.agent import AgentError, agent_argv
    from loop.brief import read_ideas
    from loop.driver import LoopConfig, LoopError, run_loop
    from loop.evaluator import QUICK_RULE
    from loop.scripted import ScriptError, read_steps
    from loop.stopping import StopRule
    from loop.store import StoreError, default_store_url
    from loop.workspace import WorkspaceError

    if proposer == "scripted" and script is None:
        raise UsageFailure("--proposer scripted needs --script FOLDER")
    if proposer == "agent" and not agent_command:
        raise UsageFailure("--proposer agent needs --agent-command")
    try:  # before the noise calibration, which takes a while
        if proposer == "scripted":
            read_steps(script)
        if proposer == "agent":
            agent_argv(agent_command, Path("brief.md"), Path("."))
    except (ScriptError, AgentError) as exc:
        raise UsageFailure(str(exc)) from exc

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
        proposer=proposer,
        script=script,
        agent_command=agent_command,
        agent_timeout_s=agent_timeout,
        ideas=read_ideas(ideas, ideas_file),
        stop=StopRule(
            seconds=time_budget,
            agent_calls=agent_calls,
            plateau=plateau,
            goal_speedup=goal_speedup,
            goal_roofline=goal_roofline,
        ),
        noise_floor=noise_floor,
        final=not no_final,
        study=study,
        sampler=sampler,
    )
    try:
        with loop_progress(quiet=as_json, note=note) as on_event:
            result = run_loop(cfg, on_event)
    except (StoreError, ScriptError, AgentError, WorkspaceError) as exc:
        raise UsageFailure(str(exc)) from exc
    except LoopError as exc:
        console.print(f"[red]loop stopped[/red]: {exc}")
        raise SystemExit(EXIT_REJECTED) from exc
    if as_json:
        emit_json(result.to_dict())
    else:
        from appliance.progress import render_final_table

        if result.final:
            out_console.print(render_final_table(result))
        out_console.print(
            f"stopped ({result.stop['code']}): {result.stop_reason}; "
            f"results: {out_dir / 'results.tsv'}; workspace: {result.workspace}"
        )


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

"""Options and helpers shared by the `autotune` subcommands."""

from __future__ import annotations

import json
from pathlib import Path

import click

from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    UsageFailure,
    console,
    emit_json,
    out_console,
)

DEVICE = click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="Where kernels run; auto picks the GPU when torch sees one.",
)
OUT_FILE = click.option(
    "--out",
    "out_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the JSON result here.",
)
JSON = click.option(
    "--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout."
)

JOURNAL = click.option(
    "--journal",
    type=click.Path(path_type=Path),
    default=None,
    help="Journal file [default: /run/autotune/host-journal.jsonl as root, else under ~/.local/state].",
)


def candidate_args(task_name: str, candidate: str, params: str | None):
    from loop.evaluator import CandidateSpec
    from loop.tasks import TaskError, load_task

    try:
        task = load_task(task_name)
    except TaskError as exc:
        raise UsageFailure(str(exc)) from exc
    if task.distributed:
        raise UsageFailure(
            f"task {task.name} runs one process per GPU: verify and time its candidates with "
            "loop.distributed.run_distributed_task (scripts/bench_allreduce_gpu.sh), not here"
        )
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


def reason_codes_epilog() -> str:
    from loop.reasons import codes_help

    return "\b\nReason codes:\n" + codes_help() + "\n\n" + EXIT_CODES_HELP


def check_shapes(task, device: str, shapes: tuple[str, ...]) -> None:
    known = {s.name for s in task.shapes(device)}
    unknown = [s for s in shapes if s not in known]
    if unknown:
        raise UsageFailure(
            f"unknown shape(s) {unknown}; {task.name} on {device} has {sorted(known)}"
        )


def chosen_peers(task, device: str, asked: tuple[str, ...]) -> list[str]:
    available = list(task.peers)
    if asked:
        unknown = [p for p in asked if p not in available]
        if unknown:
            raise UsageFailure(f"unknown peer(s) {unknown}; {task.name} has {available}")
        return list(dict.fromkeys(asked))  # a peer named twice is timed once
    return task.default_peers(device)


def print_verdict(data: dict, as_json: bool) -> None:
    if as_json:
        emit_json(data)
        return
    colour = "green" if data["verdict"] == "accepted" else "red"
    out_console.print(
        f"[{colour}]{data['verdict']}[/{colour}] {data['candidate']} {data.get('params') or ''} on {data['device']}"
    )
    for r in data["reasons"]:
        out_console.print(f"  {r['code']}: {r['message']}")


def write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
    except OSError as exc:
        raise UsageFailure(f"cannot write {path}: {exc.strerror}") from exc


PREFLIGHT = click.option(
    "--preflight",
    type=click.Choice(["warn", "refuse", "off"]),
    default="warn",
    show_default=True,
    help="Before measuring on a GPU: check other processes, persistence, pending ECC/MIG "
    "changes and temperature; warn, refuse to measure, or skip the check.",
)


def run_preflight(device: str, policy: str, profile: str | None = None) -> dict | None:
    """Pre-flight of the GPU the measurement will use (NVML), printed to stderr; refuses with
    exit 1 under `--preflight refuse` when a finding says the GPU is not fit to measure. Also
    pins this process (and the workers it starts) to the CPUs local to that GPU."""
    if device != "cuda" or policy == "off":
        return None
    import torch

    from baselines.preflight import pin_to_gpu_local_cpus, preflight
    from baselines.telemetry import nvml_index_of
    from host_tuning.nvml import probe_nvml

    probe = probe_nvml()
    index = 0
    if probe.backend is not None:
        try:
            index = nvml_index_of(probe.backend, torch.device("cuda", torch.cuda.current_device()))
        finally:
            probe.backend.close()
    if index is None:
        index = 0
    result = preflight(index, profile=profile, policy=policy)
    for line in result.lines():
        console.print(f"[yellow]preflight[/yellow] {line}", highlight=False)
    if result.refused:
        console.print(
            "[red]refused to measure[/red]: fix the findings above or pass --preflight warn"
        )
        raise SystemExit(EXIT_REJECTED)
    pin_to_gpu_local_cpus(index)
    return result.to_dict()

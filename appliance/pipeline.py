"""The main job, `autotune run`: host check, profile plan (dry run), baselines, the loop over the
tasks, and the report (JSON validated against the schema, and Markdown), stage by stage.

With `apply` the profile is really applied (on the simulated NVML device with `simulate`):
pre-flight first, then after the loop a gains stage that measures the dispatch winners and the
best peers on the stock and the tuned host, interleaved (appliance.gains), applying the profile
before each tuned block and restoring it after; the report then holds `gains`."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.devices import resolve_device
from appliance.output import UsageFailure, console, ensure_writable_dir
from appliance.progress import loop_progress

if TYPE_CHECKING:
    from appliance.tuned_host import TunedHost
    from host_tuning.profiles import Change
    from loop.tasks import Task

# Where candidate paths in the report are shown relative to (a checkout; absolute elsewhere).
REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TRIALS = {"cpu": 6, "cuda": 18}


@dataclass
class PipelineConfig:
    out_dir: Path
    tasks: list[str] = field(default_factory=list)
    trials: int | None = None
    store_url: str | None = None
    profile: str = "stable"
    device: str = "auto"
    quick: bool = False
    keep_ids: bool = False
    apply: bool = False
    simulate: str | None = None  # a simulated NVML fixture takes the profile, not the GPU
    gain_rounds: int | None = None  # host-state rounds [default: 2 quick or CPU, else 3]


@dataclass
class PipelineResult:
    report_json: Path
    report_md: Path
    errors: list[str]
    report: dict

    @property
    def restored(self) -> bool | None:
        """Every applied change was undone (None for a dry run)."""
        return (self.report.get("profile") or {}).get("restored")


def _stage(title: str, quiet: bool) -> None:
    if not quiet:
        console.rule(f"[bold]{title}")


def run_pipeline(cfg: PipelineConfig, quiet: bool = False) -> PipelineResult:
    """The whole run; what it prints is also kept in `out_dir/run.log`, crash or not."""
    ensure_writable_dir(cfg.out_dir, "--out")
    console.record = True
    try:
        return _run_pipeline(cfg, quiet)
    finally:
        (cfg.out_dir / "run.log").write_text(console.export_text(clear=True))
        console.record = False


def _run_pipeline(cfg: PipelineConfig, quiet: bool) -> PipelineResult:
    from appliance.fingerprint import collect_fingerprint
    from appliance.report import render_html, render_markdown, validate_report
    from appliance.report.build import proposals_from_tasks
    from loop.tasks import DEFAULT_TASKS, TaskError, available_tasks, load_task

    started = time.monotonic()
    ensure_writable_dir(cfg.out_dir, "--out")
    try:
        names = list(cfg.tasks or DEFAULT_TASKS)
        if "all" in names:
            names = available_tasks()
        tasks = [load_task(name) for name in names]
    except TaskError as exc:
        raise UsageFailure(str(exc)) from exc
    if cfg.simulate is not None and not cfg.apply:
        raise UsageFailure("--simulate FIXTURE only makes sense with --apply")
    device, note = resolve_device(cfg.device)
    if not quiet:
        console.print(note)
    tasks, skipped = _tasks_with_candidates(tasks, device, every="all" in names)
    if skipped and not quiet:
        console.print(f"  skipped (no single-process candidate on {device}): {', '.join(skipped)}")

    tuned = None
    if cfg.apply:
        from appliance.tuned_host import open_tuned_host

        tuned = open_tuned_host(cfg.profile, cfg.simulate, cfg.out_dir)
        profile, planned = None, _plan_and_preflight(tuned, quiet)
        total = 6
    else:
        profile, planned = profile_section(cfg.profile), []
        total = 5

    _stage(f"1/{total} host check", quiet)
    host = host_section()
    if not quiet:
        counts = {
            s: sum(c["status"] == s for c in host["checks"])
            for s in ("pass", "warn", "fail", "unknown")
        }
        console.print("  " + ", ".join(f"{n} {s}" for s, n in counts.items()))

    if tuned is None:
        _stage("2/5 profile plan (dry run)", quiet)
        _print_changes(profile["changes"], quiet)
    else:
        _stage(f"2/{total} profile plan and pre-flight ({tuned.nvml} NVML device)", quiet)
        _print_changes([c.to_dict() for c in planned], quiet)
        _print_preflight(tuned, quiet)

    telemetry = start_run_telemetry(device)
    _stage(f"3/{total} baselines", quiet)
    _label(telemetry, "baselines")
    baselines = baseline_section(device, quiet, quick=cfg.quick or device == "cpu")

    _stage(f"4/{total} loop", quiet)
    _label(telemetry, "loop")
    task_sections, noise, loop_info = [], None, []
    trials = cfg.trials or DEFAULT_TRIALS[device]
    for task in tasks:
        if not quiet:
            console.print(f"[bold]{task.name}[/bold]")
        section, calibration, info = loop_section(task, device, trials, cfg, quiet)
        task_sections.append(section)
        noise = noise or calibration
        loop_info.append(info)

    gains = None
    if tuned is not None:
        _stage(f"5/{total} gains: stock and tuned host, interleaved", quiet)
        _label(telemetry, "gains")
        gains = gains_section(tuned, planned, tasks, task_sections, loop_info, device, cfg, quiet)
        profile = _restored_profile(tuned, planned, quiet)

    if telemetry is not None:
        telemetry.__exit__(None, None, None)
    _stage(f"{total}/{total} report", quiet)
    report = {
        "schema_version": "2",
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reproduce": {
            "command": reproduce_command(cfg, device),
            "verify_command": shlex.join(
                ["autotune", "report", "verify", str(cfg.out_dir / "report.json")]
            ),
        },
        "fingerprint": collect_fingerprint(keep_ids=cfg.keep_ids),
        "host": host,
        "profile": profile,
        "baselines": baselines,
        "noise": noise,
        "tasks": task_sections,
        "loop": {
            "store": loop_info[0]["store"] if loop_info else "none",
            "resumed": any(i["resumed"] for i in loop_info),
            "stop_reason": "; ".join(f"{i['task']}: {i['stop_reason']}" for i in loop_info)
            or "no tasks",
            "duration_s": time.monotonic() - started,
            "proposals": proposals_from_tasks(task_sections),
        },
    }
    if gains is not None:
        report["gains"] = gains
    if telemetry is not None:
        report["telemetry"] = telemetry.to_dict()
    errors = [str(e) for e in validate_report(report)]
    report_json = cfg.out_dir / "report.json"
    report_md = cfg.out_dir / "report.md"
    report_html = cfg.out_dir / "report.html"
    report_json.write_text(json.dumps(report, indent=2))
    if not errors:
        report_md.write_text(render_markdown(report))
        report_html.write_text(render_html(report))
    if not quiet:
        state = "[green]valid[/green]" if not errors else f"[red]{len(errors)} schema errors[/red]"
        console.print(f"  report {state}: {report_json}, {report_md}, {report_html}")
        for e in errors[:10]:
            console.print(f"    {e}")
    return PipelineResult(report_json, report_md, errors, report)


def start_run_telemetry(device: str):
    """NVML telemetry over the measuring stages of a GPU run (None on the CPU, or when NVML
    cannot be read: the report then says the plot was not measured)."""
    if device != "cuda":
        return None
    import torch

    from baselines.run_telemetry import RunTelemetry
    from baselines.telemetry import nvml_index_of
    from host_tuning.nvml import probe_nvml

    backend = probe_nvml().backend
    if backend is None:
        return None
    try:
        index = nvml_index_of(backend, torch.device("cuda", torch.cuda.current_device()))
        return None if index is None else RunTelemetry(backend, index).__enter__()
    except Exception as exc:  # telemetry is a record, never a reason to stop the run
        console.print(f"  no run telemetry: {type(exc).__name__}: {exc}")
        return None


def _label(telemetry, stage: str) -> None:
    if telemetry is not None:
        telemetry.label = stage


def reproduce_command(cfg: PipelineConfig, device: str) -> str:
    parts = [
        "autotune",
        "run",
        "--out",
        str(cfg.out_dir),
        "--device",
        device,
        "--profile",
        cfg.profile,
    ]
    for task in cfg.tasks:
        parts += ["--task", task]
    if cfg.trials:
        parts += ["--trials", str(cfg.trials)]
    if cfg.quick:
        parts.append("--quick")
    if cfg.keep_ids:
        parts.append("--keep-ids")
    if cfg.apply:
        parts.append("--apply")
    if cfg.simulate is not None:
        parts += ["--simulate", cfg.simulate]
    if cfg.gain_rounds:
        parts += ["--gain-rounds", str(cfg.gain_rounds)]
    return shlex.join(parts)


def _print_changes(changes: list[dict], quiet: bool) -> None:
    if quiet:
        return
    for change in changes:
        console.print(
            f"  {change['setting']}: {change['before']} -> {change['after']} ({change.get('status', 'planned')})"
        )
    if not changes:
        console.print("  nothing to change")


def _plan_and_preflight(tuned: TunedHost, quiet: bool) -> list[Change]:
    """The plan against the device the profile goes to, and the pre-flight (policy refuse),
    both before anything is measured; TuningRefused when the pre-flight refuses."""
    from appliance.tuned_host import TuningRefused, plan_changes, run_preflight

    planned = plan_changes(tuned)
    tuned.preflight = run_preflight(tuned)
    if tuned.preflight.refused:
        lines = "; ".join(tuned.preflight.lines())
        raise TuningRefused(f"pre-flight of GPU {tuned.preflight.device_index}: {lines}")
    return planned


def _print_preflight(tuned: TunedHost, quiet: bool) -> None:
    if quiet:
        return
    lines = tuned.preflight.lines()
    console.print("  pre-flight: " + ("nothing found" if not lines else "; ".join(lines)))
    console.print(f"  journal: {tuned.journal}")


def _restored_profile(tuned: TunedHost, planned: list[Change], quiet: bool) -> dict:
    from appliance.tuned_host import profile_report

    section = profile_report(tuned, planned)
    if not quiet:
        state = "restored" if section["restored"] else "[red]NOT restored[/red]"
        console.print(f"  profile {tuned.profile.name}: applied {tuned.blocks} time(s), {state}")
        for error in section["restore_errors"]:
            console.print(f"  [red]{error}[/red]")
    return section


def gains_section(
    tuned: TunedHost,
    planned: list[Change],
    tasks: list[Task],
    task_sections: list[dict],
    loop_info: list[dict],
    device: str,
    cfg: PipelineConfig,
    quiet: bool,
) -> dict:
    """The `gains` block: rounds of stock and tuned host (apply before each tuned block, restore
    after it), the dispatch winners and best peers timed in each, the suite in the first round.
    A failed measurement gives null gains with a note; the host is restored either way (a
    signal still ends the run, after the restore)."""
    from appliance.gain_workload import (
        QUICK_RULE,
        measure_kernels,
        plan_from_section,
        workload_of,
    )
    from appliance.gains import GainsError, StateSample, gains_block, interleave_host_states
    from appliance.tuned_host import hold_profile, run_preflight
    from baselines.preflight import PreflightRefused
    from baselines.suite import run_suite
    from host_tuning.apply import ApplyError

    say = (lambda m: None) if quiet else (lambda m: console.print(f"  {m}"))
    quick = cfg.quick or device == "cpu"
    rounds = cfg.gain_rounds or (2 if quick else 3)
    rule = QUICK_RULE if quick else {}
    plans = [
        plan_from_section(task, section, info["candidate"], info["params"])
        for task, section, info in zip(tasks, task_sections, loop_info, strict=True)
    ]
    workload = workload_of(plans)

    def measure(state: str, r: int) -> StateSample:
        sample = measure_kernels(plans, device, rule, say)
        if r == 1:
            say(f"  baseline suite on the {state} host")
            sample.suite = run_suite(device, quick=quick).to_dict()
        return sample

    host_label = f"profile {tuned.profile.name}"
    notes = [
        f"host states interleaved over {rounds} round(s): stock, then {host_label} applied "
        "before the block and restored after it; the baseline suite ran once per state, in "
        "round 1"
    ]
    if tuned.simulated:
        fixture = tuned.nvml.removeprefix("simulated: ")
        host_label += f" (simulated {fixture} NVML device)"
        notes.append(
            f"the profile went to the simulated NVML device {fixture}, not to the GPU: its "
            "clocks did not change, so the hardware gain is noise around 1 and shows that the "
            "apply/restore path ran, not a speedup"
        )
    if not any(c.status == "planned" for c in planned):
        notes.append(f"profile {tuned.profile.name} changes nothing on this host")
    try:
        again = run_preflight(tuned)  # the loop took a while: is the GPU still fit?
        say("pre-flight again: " + ("; ".join(again.lines()) or "nothing found"))
        again.raise_if_refused()
        measured = interleave_host_states(measure, lambda: hold_profile(tuned), rounds, say)
    except (GainsError, ApplyError, PreflightRefused) as exc:
        say(f"[red]gains not measured[/red]: {exc}")
        return {"hardware": None, "kernel": None, "end_to_end": None, "notes": [str(exc)]}
    return gains_block(measured, workload, tuned_host=host_label, notes=notes)


def host_section() -> dict:
    from host_tuning.report import host_report

    report = host_report()
    checks = [
        {
            k: c.get(k)
            for k in (
                "id",
                "status",
                "actual",
                "recommended",
                "severity",
                "fix",
                "message",
                "needs",
                "subject",
            )
        }
        for c in report["checks"]
    ]
    return {
        "gpu_present": report["gpu_present"],
        "facts": report["facts"],
        "checks": checks,
        "note": report["note"],
    }


def profile_section(name: str) -> dict:
    """The profile's plan against this host, never applied by the pipeline (a dry run)."""
    from host_tuning.apply import report_section
    from host_tuning.nvml import probe_nvml
    from host_tuning.profiles import ProfileError, load_profile, plan

    try:
        profile = load_profile(name)
    except ProfileError as exc:
        raise UsageFailure(str(exc)) from exc
    return report_section(profile.name, plan(profile, probe_nvml().backend, None), applied=False)


def baseline_section(device: str, quiet: bool, quick: bool) -> dict:
    from baselines.suite import run_suite

    result = run_suite(
        device, quick=device == "cpu", progress=None if quiet else lambda m: console.print(f"  {m}")
    )
    data = result.to_dict()
    metrics = [
        {k: m[k] for k in ("name", "unit", "value", "ci_low", "ci_high", "n")}
        for m in data["metrics"]
    ]
    env = data["environment"]
    return {
        "metrics": metrics,
        "environment": {"kind": env["kind"], "evidence": list(env["evidence"])},
    }


def _tasks_with_candidates(tasks: list, device: str, every: bool) -> tuple[list, list[str]]:
    """The tasks the loop can run here, and the names of those it cannot (a task whose
    candidates run one process per GPU, or that ships none for `device`): skipped under `all`,
    refused when named."""
    runnable, skipped = [], []
    for task in tasks:
        if not task.distributed and task.candidate_paths(device):
            runnable.append(task)
        elif every:
            skipped.append(task.name)
        else:
            raise UsageFailure(
                f"task {task.name} has no single-process candidate on {device}"
                + (
                    " (it runs one process per GPU: scripts/bench_allreduce_gpu.sh)"
                    if task.distributed
                    else ""
                )
            )
    return runnable, skipped


def loop_section(
    task, device: str, trials: int, cfg: PipelineConfig, quiet: bool
) -> tuple[dict, dict | None, dict]:
    from appliance.report.build import candidate_spec, shape_claim
    from loop.driver import LoopConfig, run_loop
    from loop.evaluator import QUICK_RULE
    from loop.store import default_store_url

    paths = task.candidate_paths(device)
    candidate = paths[0]
    cfg_loop = LoopConfig(
        task,
        candidate,
        device,
        trials,
        cfg.store_url or default_store_url(cfg.out_dir),
        cfg.out_dir,
        peers=task.default_peers(device),
        rule=QUICK_RULE if device == "cpu" or cfg.quick else {},
    )
    with loop_progress(quiet=quiet) as on_event:
        result = run_loop(cfg_loop, on_event)
    if not quiet:
        # a study already in --out is resumed: a spent trial budget runs no trial, and says so
        resumed = f"resumed the study in {cfg.out_dir}; " if result.resumed else ""
        console.print(f"  {resumed}stopped ({result.stop['code']}): {result.stop_reason}")
    from loop.guards import check_source

    language = check_source(candidate.read_text(), str(candidate)).language or "torch"
    finished = [t for t in result.trials if t["status"] in ("keep", "discard", "crash")]
    dispatch = [
        {
            "bucket": _bucket(entry["dims"], task.bucket_key),
            "shapes": [entry["shape"]],
            "candidate": entry["name"] if entry["source"] == "peer" else candidate.stem,
            "params": entry["params"],
            "source": entry["source"],
        }
        for entry in result.dispatch["entries"]
    ]
    shapes = []
    for row in result.final:
        cand = row["candidate"]
        if row["winner"] == "candidate":
            winner = {
                "candidate": candidate.stem,
                "params": result.incumbent["params"],
                "timing": cand,
                "speedup_vs_best_peer": _ratio(row),
            }
        else:
            peer = row["best_peer"]
            winner = {
                "candidate": peer,
                "params": {},
                "timing": row["peers"][peer],
                "speedup_vs_best_peer": {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0},
            }
        claim = shape_claim(
            candidate_spec(candidate, result.incumbent["params"], REPO_ROOT),
            row["best_peer"],
            row["speedup_vs_best_peer"],
        )
        shapes.append(
            {
                **claim,
                "name": row["shape"],
                "shape": {
                    k: v for k, v in row["dims"].items() if k not in ("name", "class", "weight")
                },
                "weight": row["weight"],
                "bytes": row["bytes"],
                "flops": row["flops"],
                "peers": row["peers"],
                "incumbent": cand,
                "winner": winner,
            }
        )
    dtypes = {s.dtype for s in task.shapes(device)}
    section = {
        "task": task.name,
        "device": device,
        "dtype": ",".join(sorted(dtypes)),
        "language_used": [language],
        "trials": len(finished),
        "accepted": sum(t["status"] in ("keep", "discard") for t in finished),
        "kept": sum(t["status"] == "keep" for t in finished),
        "rejected_by_reason": result.rejected_by_reason,
        "dispatch": dispatch,
        "shapes": shapes,
    }
    n = result.noise
    noise = {
        "aa_ratio_ci": [n["ci_low"], n["ci_high"]],
        "noise_floor": n["noise_floor"],
        "min_effect": cfg_loop.min_effect,
        "decisions": 1,
        "task": task.name,
        "ratio": n["ratio"],
    }
    if n.get("block_ratios"):
        noise["samples"] = n["block_ratios"]
        noise["sample_unit"] = "block"
    info = {
        "task": task.name,
        "store": result.store_url,
        "resumed": result.resumed,
        "stop_reason": result.stop_reason,
        "candidate": candidate,
        "params": result.incumbent["params"],
    }
    return section, noise, info


def _ratio(row: dict) -> dict | None:
    sp = row["speedup_vs_best_peer"]
    return (
        None
        if sp is None
        else {"ratio": sp["ratio"], "ci_low": sp["ci_low"], "ci_high": sp["ci_high"]}
    )


def _bucket(dims: dict, key: str | None) -> str:
    parts = [f"{k} {v}" for k, v in dims.items() if isinstance(v, int) and not isinstance(v, bool)]
    if key and key in dims:
        parts = [f"{key} >= {dims[key]}"] + [p for p in parts if not p.startswith(f"{key} ")]
    return ", ".join(parts) or "all"

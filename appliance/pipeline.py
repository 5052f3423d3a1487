"""The main job, `autotune run`: host check, profile plan (dry run), baselines, the loop over the
tasks, and the report (JSON validated against the schema, and Markdown), stage by stage."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from appliance.devices import resolve_device
from appliance.output import UsageFailure, console, ensure_writable_dir
from appliance.progress import loop_progress

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


@dataclass
class PipelineResult:
    report_json: Path
    report_md: Path
    errors: list[str]
    report: dict


def _stage(title: str, quiet: bool) -> None:
    if not quiet:
        console.rule(f"[bold]{title}")


def run_pipeline(cfg: PipelineConfig, quiet: bool = False) -> PipelineResult:
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
    device, note = resolve_device(cfg.device)
    if not quiet:
        console.print(note)

    profile = profile_section(cfg.profile)

    _stage("1/5 host check", quiet)
    host = host_section()
    if not quiet:
        counts = {
            s: sum(c["status"] == s for c in host["checks"])
            for s in ("pass", "warn", "fail", "unknown")
        }
        console.print("  " + ", ".join(f"{n} {s}" for s, n in counts.items()))

    _stage("2/5 profile plan (dry run)", quiet)
    if not quiet:
        for change in profile["changes"]:
            console.print(
                f"  {change['setting']}: {change['before']} -> {change['after']} ({change.get('status', 'planned')})"
            )
        if not profile["changes"]:
            console.print("  nothing to change")

    _stage("3/5 baselines", quiet)
    baselines = baseline_section(device, quiet, quick=cfg.quick or device == "cpu")

    _stage("4/5 loop", quiet)
    task_sections, noise, loop_info = [], None, []
    trials = cfg.trials or DEFAULT_TRIALS[device]
    for task in tasks:
        if not quiet:
            console.print(f"[bold]{task.name}[/bold]")
        section, calibration, info = loop_section(task, device, trials, cfg, quiet)
        task_sections.append(section)
        noise = noise or calibration
        loop_info.append(info)

    _stage("5/5 report", quiet)
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
    return shlex.join(parts)


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


def loop_section(
    task, device: str, trials: int, cfg: PipelineConfig, quiet: bool
) -> tuple[dict, dict | None, dict]:
    from appliance.report.build import candidate_spec, shape_claim
    from loop.driver import QUICK_RULE, LoopConfig, run_loop
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
    }
    info = {
        "task": task.name,
        "store": result.store_url,
        "resumed": result.resumed,
        "stop_reason": result.stop_reason,
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

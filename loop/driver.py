"""The loop: calibrate noise (A/A), then propose, lock-check, verify, measure against the
incumbent, keep or revert, until a stopping rule fires; finally measure the incumbent against
the peers shape by shape and write the dispatch table.

Crash safety (SIGKILL at any point): every experiment is an Optuna trial in the store; the
incumbent is a versioned record swapped by compare-and-set and carrying the keeping trial's
outcome; the workspace is reset to its branch and brought up to the store's incumbent on start;
results.tsv is rewritten from the store after every experiment. A killed trial is marked
interrupted and its configuration offered again (or, when its keep already reached the
incumbent record, completed from that record)."""

from __future__ import annotations

import csv
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import optuna

from baselines.stats import geomean_ratio_interval, summarize
from loop import brief as briefs
from loop.agent import DEFAULT_TIMEOUT_S, AgentProposer
from loop.dispatch import build_dispatch, contest, save_dispatch
from loop.evaluator import (
    CandidateSpec,
    Evaluation,
    Limits,
    evaluate,
    read_params_space,
    static_verdict,
)
from loop.profiler import ProfileResult, profile_largest_shape
from loop.proposers import Outcome, Proposal, Proposer, SearchProposer
from loop.scripted import ScriptedProposer, read_steps
from loop.stopping import Progress, Stop, StopRule, check, weighted_geomean
from loop.store import Incumbent, Ledger, open_study, owner_tag, recover_orphans
from loop.tasks import Task
from loop.workspace import Workspace, changed_files, lock, open_workspace

Event = Callable[[str, dict], None]

PROPOSERS = ("search", "scripted", "agent")
FINISHED = ("keep", "discard", "crash")


class LoopError(Exception):
    """The loop cannot go on (for example the incumbent itself fails verification)."""


@dataclass
class LoopConfig:
    task: Task
    candidate: Path
    device: str
    trials: int
    store_url: str
    out_dir: Path
    peers: list[str] = field(default_factory=list)
    min_effect: float = 0.005
    rule: dict = field(default_factory=dict)
    shapes: list[str] | None = None
    limits: Limits = field(default_factory=Limits)
    seed: int | None = None
    proposer: str = "search"
    script: Path | None = None
    agent_command: str | None = None
    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    ideas: list[str] = field(default_factory=list)
    stop: StopRule = field(default_factory=StopRule)
    noise_floor: float | None = None  # given: no A/A calibration
    final: bool = True
    study: str | None = None
    sampler: str = "auto"
    generation: str | None = None  # GPU generation for the brief [default: detected]


@dataclass
class LoopResult:
    task: str
    candidate: str
    study: str
    store_url: str
    resumed: bool
    stop_reason: str
    noise: dict
    incumbent: dict
    trials: list[dict]
    rejected_by_reason: dict
    final: list[dict]
    dispatch: dict
    seconds: float
    stop: dict = field(default_factory=dict)
    proposer: str = "search"
    workspace: str = ""
    incumbent_version: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _quiet(kind: str, data: dict) -> None:
    return None


def study_name(cfg: LoopConfig) -> str:
    if cfg.study:
        return cfg.study
    base = f"{cfg.task.name}/{cfg.candidate.name}/{cfg.device}"
    if cfg.proposer == "scripted" and cfg.script is not None:
        return f"{base}/scripted:{Path(cfg.script).name}"
    return base if cfg.proposer == "search" else f"{base}/{cfg.proposer}"


def _pairs(ev: Evaluation, base: str, cand: str) -> tuple[list, list[str]]:
    a, b = ev.by_label(base), ev.by_label(cand)
    names = [n for n in a.shapes if a.shapes[n].blocks_s and n in b.shapes and b.shapes[n].blocks_s]
    return [(a.shapes[n].blocks_s, b.shapes[n].blocks_s) for n in names], names


def _weights(task: Task, device: str, names: list[str]) -> list[float]:
    by_name = {s.name: s.weight for s in task.shapes(device)}
    return [by_name[n] for n in names]


def _medians(verdict) -> dict[str, float]:
    return {n: s.median_s for n, s in verdict.shapes.items() if s.blocks_s}


def _rejection(verdict) -> str:
    return "; ".join(f"{r.code}: {r.message}" for r in verdict.reasons)


def calibrate(cfg: LoopConfig, path: Path, params: dict) -> dict:
    """A/A: the incumbent against itself, interleaved, gives today's noise floor on this host.
    The peers are timed alongside when a speedup goal needs them."""
    specs = [CandidateSpec(path, params, "A"), CandidateSpec(path, params, "B")]
    peers = cfg.peers if cfg.stop.goal_speedup else []
    ev = evaluate(
        cfg.task,
        specs,
        cfg.device,
        time_it=True,
        peers=peers,
        shapes=cfg.shapes,
        rule=cfg.rule,
        limits=cfg.limits,
    )
    for label in ("A", "B"):
        v = ev.by_label(label)
        if not v.accepted:
            raise LoopError(
                f"the starting candidate {cfg.candidate.name} {params} is rejected: {_rejection(v)}"
            )
    pairs, names = _pairs(ev, "A", "B")
    interval = geomean_ratio_interval(pairs, _weights(cfg.task, cfg.device, names))
    best_peer = {}
    for shape in names:
        peer = ev.best_peer(shape)
        if peer is not None:
            best_peer[shape] = peer.shapes[shape].median_s
    return {
        "ratio": interval.ratio,
        "ci_low": interval.ci_low,
        "ci_high": interval.ci_high,
        "noise_floor": max(interval.ci_high - 1.0, 1.0 - interval.ci_low, 0.0),
        "seconds": ev.seconds,
        # Every interleaved block pair's A/B ratio: the noise distribution the report plots.
        "block_ratios": [a / b for xs, ys in pairs for a, b in zip(xs, ys, strict=False) if b > 0],
        "shapes": _medians(ev.by_label("A")),
        "best_peer": best_peer,
        "ceilings": ev.ceilings,
    }


def _trial_record(trial: optuna.trial.FrozenTrial, commits: dict[int, str]) -> dict:
    a = trial.user_attrs
    return {
        "number": trial.number,
        "params": dict(trial.params) or dict(a.get("proposal_params") or {}),
        "state": trial.state.name,
        "kind": a.get("kind"),
        "status": a.get("status"),
        "reasons": a.get("reasons", []),
        "messages": a.get("messages", []),
        "speedup": a.get("speedup"),
        "description": a.get("description", ""),
        "commit": commits.get(trial.number, ""),
        "seconds": a.get("seconds"),
    }


def _finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    trials = study.get_trials(deepcopy=False)
    return sorted(
        (t for t in trials if t.user_attrs.get("status") in FINISHED), key=lambda t: t.number
    )


def results_rows(study: optuna.Study, ledger: Ledger) -> list[dict]:
    commits = ledger.commits()
    rows = []
    for t in _finished(study):
        r = _trial_record(t, commits)
        sp = r["speedup"]
        rows.append(
            {
                "trial": r["number"],
                "commit": r["commit"][:12],
                "speedup": "" if sp is None else f"{sp['ratio']:.4f}",
                "ci_low": "" if sp is None else f"{sp['ci_low']:.4f}",
                "ci_high": "" if sp is None else f"{sp['ci_high']:.4f}",
                "verdict": "rejected"
                if r["status"] == "crash"
                else ("accepted" if sp else "not evaluated"),
                "status": r["status"],
                "reasons": ",".join(r["reasons"]),
                "description": r["description"]
                + (f" ({r['messages'][0][:200]})" if r["messages"] else ""),
                "speedup_text": "-"
                if sp is None
                else f"{sp['ratio']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]",
            }
        )
    return rows


def write_results(path: Path, rows: list[dict]) -> None:
    """results.tsv, rewritten whole from the store (atomic rename): never a lost or doubled row."""
    fields = ["trial", "commit", "speedup", "ci_low", "ci_high", "verdict", "status", "reasons"]
    fields.append("description")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, delimiter="\t", extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: str(v).replace("\t", " ").replace("\n", " ") for k, v in row.items()}
            )
    os.replace(tmp, path)


def _commit_message(inc: Incumbent) -> str:
    v = inc.value
    sp = v.get("speedup") or {}
    lines = [f"keep trial {v.get('trial')}: {v.get('description', '')}".strip(), ""]
    if sp:
        lines.append(
            f"speedup over incumbent v{inc.version - 1}: {sp['ratio']:.4f}x "
            f"[{sp['ci_low']:.4f}, {sp['ci_high']:.4f}] (weighted geomean over shapes)"
        )
    if v.get("params"):
        lines.append(f"params: {v['params']}")
    for name, t in sorted((v.get("shapes") or {}).items()):
        lines.append(f"{name}: {t * 1e6:.2f} us")
    return "\n".join(lines)


def sync_workspace(ws: Workspace, inc: Incumbent, ledger: Ledger) -> None:
    """Bring the workspace's branch up to the store's incumbent (a commit per new version)."""
    if ws.state().get("version") == inc.version:
        return
    ws.revert()
    ws.candidate.write_text(inc.value["source"])
    state = {k: inc.value.get(k) for k in ("trial", "params", "speedup", "description")}
    sha = ws.commit(_commit_message(inc), dict(state, version=inc.version))
    if inc.value.get("trial") is not None:
        ledger.set_commit(inc.value["trial"], sha)


def _snapshot(folder: Path, name: str, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.exists() or path.read_text() != source:
        path.write_text(source)
    return path


def _progress(cfg: LoopConfig, study, inc: Incumbent, noise: dict, started: float) -> Progress:
    finished = _finished(study)
    since_keep = 0
    for t in reversed(finished):
        if t.user_attrs.get("status") == "keep":
            break
        since_keep += 1
    shapes = inc.value.get("shapes") or noise.get("shapes") or {}
    names = sorted(shapes)
    weights = _weights(cfg.task, cfg.device, names)
    peers = noise.get("best_peer") or {}
    vs_peer = weighted_geomean([peers.get(n, 0) / shapes[n] for n in names], weights)
    roof = None
    ceilings = noise.get("ceilings")
    if ceilings and ceilings.get("copy_bytes_per_s"):
        by_name = {s.name: s for s in cfg.task.shapes(cfg.device)}
        fracs = []
        for n in names:
            s = by_name[n]
            floor = cfg.task.bytes_moved(s) / ceilings["copy_bytes_per_s"]
            if ceilings.get("flops_per_s"):
                floor = max(floor, cfg.task.flops(s) / ceilings["flops_per_s"])
            fracs.append(floor / shapes[n])
        roof = weighted_geomean(fracs, weights)
    return Progress(
        finished=len(finished),
        seconds=time.monotonic() - started,
        agent_calls=sum(1 for t in finished if t.user_attrs.get("kind") == "agent"),
        since_keep=since_keep,
        speedup_vs_peer=vs_peer,
        roofline_fraction=roof,
    )


def _make_proposer(cfg, study, ledger, owner, ws, space, brief_fn) -> Proposer:
    if cfg.proposer == "search":
        return SearchProposer(study, ws.candidate, space, owner, ledger)
    if cfg.proposer == "scripted":
        if cfg.script is None:
            raise LoopError("the scripted proposer needs --script FOLDER")
        return ScriptedProposer(study, ledger, owner, ws, read_steps(cfg.script))
    if cfg.proposer == "agent":
        if not cfg.agent_command:
            raise LoopError("the agent proposer needs --agent-command")
        return AgentProposer(
            study,
            ledger,
            owner,
            ws,
            cfg.agent_command,
            brief_fn,
            cfg.out_dir / "agent",
            cfg.agent_timeout_s,
        )
    raise LoopError(f"unknown proposer {cfg.proposer!r}: one of {', '.join(PROPOSERS)}")


def run_loop(cfg: LoopConfig, on_event: Event = _quiet) -> LoopResult:
    started = time.monotonic()
    source = cfg.candidate.read_text()
    space = (read_params_space(source) or {}) if cfg.proposer == "search" else {}
    name = study_name(cfg)
    study = open_study(cfg.store_url, name, space, cfg.seed, cfg.sampler)
    ledger = Ledger(cfg.store_url, name)
    resumed = bool(study.get_trials(deepcopy=False))
    start = {"source": source, "params": {}, "trial": None, "description": "as given"}
    requeued = recover_orphans(study, ledger, start)
    if requeued:
        on_event("requeued", {"params": requeued})
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    tsv = cfg.out_dir / "results.tsv"
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    ws = open_workspace(
        cfg.out_dir / "workspace" / safe, cfg.task.folder, cfg.candidate.name, source
    )
    private = cfg.out_dir / "workspace" / f".incumbent-{os.getpid()}"
    inc = ledger.incumbent(start)
    sync_workspace(ws, inc, ledger)

    noise = study.user_attrs.get("noise")
    if noise is None:
        if cfg.noise_floor is not None:
            noise = {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0, "given": True}
            noise["noise_floor"] = cfg.noise_floor
        else:
            on_event("calibrate", {"params": inc.value["params"]})
            path = _snapshot(private, cfg.candidate.name, inc.value["source"])
            noise = calibrate(cfg, path, inc.value["params"])
        study.set_user_attr("noise", noise)
    on_event("calibrated", noise)
    threshold = max(cfg.min_effect, noise["noise_floor"])
    stop_rule = StopRule(**{**asdict(cfg.stop), "trials": cfg.trials})
    generation = cfg.generation or briefs.detect_generation(cfg.device)

    profiled: dict[int, dict[str, ProfileResult]] = {}  # the incumbent version's counters

    def brief_text() -> str:
        current = ledger.incumbent(start)
        if current.version not in profiled:  # once per incumbent: an ncu run takes seconds
            snap = _snapshot(private, cfg.candidate.name, current.value["source"])
            params = current.value.get("params") or {}
            profiled.clear()
            profiled[current.version] = profile_largest_shape(
                cfg.task, snap, params, cfg.device, cfg.shapes
            )
        return briefs.build_brief(
            briefs.BriefInput(
                task=cfg.task,
                device=cfg.device,
                candidate_name=cfg.candidate.name,
                source=current.value["source"],
                params=current.value.get("params") or {},
                ideas=cfg.ideas,
                shapes=cfg.shapes,
                medians_s=current.value.get("shapes") or noise.get("shapes") or {},
                ceilings=noise.get("ceilings"),
                results=results_rows(study, ledger),
                generation=generation,
                profiles=profiled[current.version],
            )
        )

    owner = owner_tag()
    proposer = _make_proposer(cfg, study, ledger, owner, ws, space, brief_text)
    write_results(tsv, results_rows(study, ledger))
    stop: Stop | None = None
    try:
        while True:
            inc = ledger.incumbent(start)
            sync_workspace(ws, inc, ledger)
            stop = check(stop_rule, _progress(cfg, study, inc, noise, started))
            if stop is not None:
                break
            slot = ledger.take_slot(cfg.trials, owner)
            if slot is None:
                stop = Stop("trials", f"trial budget reached ({cfg.trials}, all taken)")
                break
            before = lock(ws, cfg.task.folder)
            t0 = time.monotonic()
            proposal = proposer.propose()
            if proposal is None:
                ledger.release(slot)
                stop = Stop("exhausted", f"the {cfg.proposer} proposer has nothing left to try")
                break
            ledger.bind(slot, proposal.trial_number)
            propose_s = time.monotonic() - t0
            on_event(
                "trial",
                {
                    "number": proposal.trial_number,
                    "params": proposal.params,
                    "done": len(_finished(study)),
                    "total": cfg.trials,
                    "description": proposal.description,
                },
            )
            outcome, inc = _judge(cfg, ws, before, proposal, inc, threshold, ledger, private, start)
            _record(study, proposal, outcome, inc, propose_s, time.monotonic() - t0)
            proposer.feedback(proposal, outcome)
            if outcome.status == "keep":
                sync_workspace(ws, ledger.incumbent(start), ledger)
            else:
                ws.revert()
            write_results(tsv, results_rows(study, ledger))
            on_event(
                "trial-done",
                {
                    "number": proposal.trial_number,
                    "status": outcome.status,
                    "speedup": outcome.speedup,
                    "reasons": outcome.reasons,
                    "messages": outcome.messages,
                },
            )
    finally:
        shutil.rmtree(private, ignore_errors=True)

    inc = ledger.incumbent(start)
    commits = ledger.commits()
    trials = [_trial_record(t, commits) for t in study.get_trials(deepcopy=False)]
    rejected = Counter(code for t in trials if t["status"] == "crash" for code in t["reasons"])
    incumbent = {
        "params": inc.value.get("params") or {},
        "trial": inc.value.get("trial"),
        "speedup": inc.value.get("speedup"),
        "description": inc.value.get("description"),
        "commit": commits.get(inc.value.get("trial"), ""),
        "source": inc.value["source"],
    }
    final, dispatch = [], {}
    if cfg.final:
        on_event("final", {"params": incumbent["params"]})
        path = _snapshot(private, cfg.candidate.name, inc.value["source"])
        try:
            final = final_comparison(cfg, incumbent["params"], path)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        rows = [
            {
                "shape": f["shape"],
                "dims": f["dims"],
                "source": f["winner"],
                "name": cfg.candidate.name if f["winner"] == "candidate" else f["best_peer"],
                "params": incumbent["params"] if f["winner"] == "candidate" else {},
                "commit": incumbent["commit"] if f["winner"] == "candidate" else "",
                "speedup": f["speedup_vs_best_peer"],
            }
            for f in final
        ]
        dispatch = build_dispatch(cfg.task.name, cfg.task.bucket_key, rows)
        save_dispatch(dispatch, cfg.out_dir / f"dispatch-{cfg.task.name}.json")
    return LoopResult(
        task=cfg.task.name,
        candidate=str(cfg.candidate),
        study=name,
        store_url=cfg.store_url,
        resumed=resumed,
        stop_reason=stop.message,
        noise=noise,
        incumbent=incumbent,
        trials=trials,
        rejected_by_reason=dict(rejected),
        final=final,
        dispatch=dispatch,
        seconds=time.monotonic() - started,
        stop=stop.to_dict(),
        proposer=cfg.proposer,
        workspace=str(ws.root),
        incumbent_version=inc.version,
    )


def _record(study, proposal: Proposal, outcome: Outcome, inc: Incumbent, propose_s, total_s):
    trial = proposal.trial
    attrs = {
        "status": outcome.status,
        "reasons": outcome.reasons,
        "messages": outcome.messages,
        "speedup": outcome.speedup,
        "shapes": outcome.shapes,
        "description": proposal.description,
        "key": proposal.key,
        "against_version": inc.version - 1 if outcome.status == "keep" else inc.version,
        "seconds": {"propose": propose_s, "total": total_s},
        "proposal_params": proposal.params,
    }
    if proposal.kind != "search":
        try:
            attrs["source"] = proposal.path.read_text()
        except (OSError, UnicodeDecodeError):
            attrs["source"] = None
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if outcome.score is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(trial, outcome.score)


def _judge(cfg, ws, before, proposal, inc, threshold, ledger, private, start):
    """The verdict on one proposal, and the incumbent after it (swapped when it is a keep)."""
    if proposal.error:
        return Outcome("crash", None, [], messages=[proposal.error]), inc
    changed = changed_files(before, ws, cfg.task.folder)
    if changed:
        shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
        return Outcome("crash", None, ["workspace-modified"], messages=[shown]), inc
    if proposal.extra.get("unchanged"):
        return Outcome("discard", None, [], messages=["the candidate did not change"]), inc
    if proposal.extra.get("duplicate"):
        return Outcome("discard", None, [], messages=["same source as an earlier proposal"]), inc
    _, problems = static_verdict(cfg.task, CandidateSpec(proposal.path, proposal.params))
    if problems:
        codes = sorted({r.code for r in problems})
        return Outcome("crash", None, codes, messages=[r.message for r in problems]), inc
    for _ in range(4):
        incumbent_path = _snapshot(private, cfg.candidate.name, inc.value["source"])
        outcome = _measure(cfg, incumbent_path, inc.value["params"], proposal, threshold)
        changed = changed_files(before, ws, cfg.task.folder)
        if changed:
            return Outcome("crash", None, ["workspace-modified"], messages=changed[:5]), inc
        if outcome.status != "keep":
            return outcome, inc
        value = {
            "source": proposal.path.read_text(),
            "params": proposal.params,
            "trial": proposal.trial_number,
            "description": proposal.description,
            "speedup": outcome.speedup,
            "shapes": outcome.shapes,
            "score": outcome.score,
            "status": "keep",
        }
        swapped = ledger.swap_incumbent(inc.version, value)
        if swapped is not None:
            return outcome, swapped
        inc = ledger.incumbent(start)  # another process kept meanwhile: measure against it
    return Outcome("discard", None, [], messages=["the incumbent kept changing"]), inc


def _measure(cfg: LoopConfig, incumbent: Path, params: dict, proposal: Proposal, threshold):
    specs = [
        CandidateSpec(incumbent, params, "incumbent"),
        CandidateSpec(proposal.path, proposal.params, "challenger"),
    ]
    ev = evaluate(
        cfg.task,
        specs,
        cfg.device,
        time_it=True,
        shapes=cfg.shapes,
        rule=cfg.rule,
        limits=cfg.limits,
    )
    challenger = ev.by_label("challenger")
    if not challenger.accepted:
        return Outcome(
            "crash",
            None,
            sorted({r.code for r in challenger.reasons}),
            messages=[r.message for r in challenger.reasons],
        )
    incumbent_verdict = ev.by_label("incumbent")
    if not incumbent_verdict.accepted:
        # Beside the challenger only, or on its own too? A challenger that makes the kept
        # kernel fail must not end the loop: it is the one discarded.
        alone = evaluate(
            cfg.task,
            specs[:1],
            cfg.device,
            time_it=True,
            shapes=cfg.shapes,
            rule=cfg.rule,
            limits=cfg.limits,
        ).by_label("incumbent")
        if not alone.accepted:
            raise LoopError("the incumbent failed verification: " + _rejection(alone))
        return Outcome(
            "crash",
            None,
            sorted({r.code for r in incumbent_verdict.reasons}),
            messages=[
                f"the incumbent failed beside this challenger (and passed alone): {r.message}"
                for r in incumbent_verdict.reasons
            ],
        )
    pairs, names = _pairs(ev, "incumbent", "challenger")
    interval = geomean_ratio_interval(pairs, _weights(cfg.task, cfg.device, names))
    speed = {"ratio": interval.ratio, "ci_low": interval.ci_low, "ci_high": interval.ci_high}
    keep = interval.ci_low > 1.0 + threshold
    return Outcome(
        "keep" if keep else "discard",
        interval.ratio,
        speedup=speed,
        shapes=_medians(challenger),
    )


def final_comparison(cfg: LoopConfig, params: dict, path: Path | None = None) -> list[dict]:
    """The incumbent against every peer, interleaved, shape by shape."""
    spec = CandidateSpec(path or cfg.candidate, params, "candidate")
    ev = evaluate(
        cfg.task,
        [spec],
        cfg.device,
        time_it=True,
        peers=cfg.peers,
        shapes=cfg.shapes,
        rule=cfg.rule,
        limits=cfg.limits,
    )
    cand = ev.by_label("candidate")
    if not cand.accepted:
        raise LoopError("the incumbent failed its final verification: " + _rejection(cand))
    peers = [v for v in ev.verdicts if v.kind == "peer" and v.accepted]
    rows = []
    for shape in cfg.task.shapes(cfg.device):
        if shape.name not in cand.shapes or not cand.shapes[shape.name].blocks_s:
            continue
        mine = cand.shapes[shape.name]
        timed = [p for p in peers if p.shapes.get(shape.name) and p.shapes[shape.name].blocks_s]
        row = {
            "shape": shape.name,
            "dims": shape.dims,
            "weight": shape.weight,
            "bytes": cfg.task.bytes_moved(shape),
            "flops": cfg.task.flops(shape),
            "candidate": _timing(mine),
            "peers": {p.label: _timing(p.shapes[shape.name]) for p in timed},
            "best_peer": None,
            "speedup_vs_best_peer": None,
            "winner": "candidate",
        }
        best = ev.best_peer(shape.name)
        if best is not None:
            row["best_peer"] = best.label
            row["speedup_vs_best_peer"], row["winner"] = contest(
                best.shapes[shape.name].blocks_s, mine.blocks_s, cfg.min_effect
            )
        rows.append(row)
    return rows


def _timing(result) -> dict:
    s = summarize(result.blocks_s)
    timing = {
        "median_s": s.median,
        "ci_low_s": s.ci_low,
        "ci_high_s": s.ci_high,
        "n_blocks": s.n,
        "n_samples": max(result.n_samples, s.n),
        "method": result.method or "host-clock",
    }
    seen = getattr(result, "telemetry", None)
    if seen:
        timing["telemetry"] = telemetry_block(seen)
    return timing


def telemetry_block(seen: dict) -> dict:
    """The report's per-timing telemetry from the worker's summary of its measured blocks."""
    spreads = {
        key: seen[key]
        for key in ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")
        if seen.get(key)
    }
    return {
        **spreads,
        "throttle_reasons": list(seen.get("reasons", [])),
        "throttled_blocks": int(seen.get("thermal_slowdown_blocks", 0))
        + int(seen.get("power_slowdown_blocks", 0)),
        "remeasured_blocks": int(seen.get("remeasured_blocks", 0)),
    }

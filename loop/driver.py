"""The loop: calibrate noise (A/A), then propose, verify, measure against the incumbent, keep or
revert, until the trial budget or the space runs out; finally measure the incumbent against the
peers shape by shape and write the dispatch table. Every experiment lives in the store, so a
killed loop resumes."""

from __future__ import annotations

import csv
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from baselines.stats import decide, geomean_ratio_interval, ratio_interval, summarize
from loop.dispatch import build_dispatch, save_dispatch
from loop.evaluator import CandidateSpec, Evaluation, Limits, evaluate, read_params_space
from loop.proposers import Outcome, Proposal, SearchProposer
from loop.store import open_study, owner_tag, recover_orphans
from loop.tasks import Task

Event = Callable[[str, dict], None]

# Fewer, shorter timing blocks: wider intervals, for quick runs and small machines.
QUICK_RULE = {"samples_per_block": 5, "min_blocks": 4, "max_blocks": 10, "max_time_s": 0.5}


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

    def to_dict(self) -> dict:
        return asdict(self)


def _quiet(kind: str, data: dict) -> None:
    return None


def _pairs(ev: Evaluation, base: str, cand: str) -> tuple[list, list[str]]:
    a, b = ev.by_label(base), ev.by_label(cand)
    names = [n for n in a.shapes if a.shapes[n].blocks_s and n in b.shapes and b.shapes[n].blocks_s]
    return [(a.shapes[n].blocks_s, b.shapes[n].blocks_s) for n in names], names


def _weights(task: Task, device: str, names: list[str]) -> list[float]:
    by_name = {s.name: s.weight for s in task.shapes(device)}
    return [by_name[n] for n in names]


def calibrate(cfg: LoopConfig, params: dict) -> dict:
    """A/A: the incumbent against itself, interleaved, gives today's noise floor on this host."""
    specs = [CandidateSpec(cfg.candidate, params, "A"), CandidateSpec(cfg.candidate, params, "B")]
    ev = evaluate(
        cfg.task,
        specs,
        cfg.device,
        time_it=True,
        shapes=cfg.shapes,
        rule=cfg.rule,
        limits=cfg.limits,
    )
    for v in ev.verdicts:
        if not v.accepted:
            detail = "; ".join(f"{r.code}: {r.message}" for r in v.reasons)
            raise LoopError(
                f"the starting candidate {cfg.candidate.name} {params} is rejected: {detail}"
            )
    pairs, names = _pairs(ev, "A", "B")
    interval = geomean_ratio_interval(pairs, _weights(cfg.task, cfg.device, names))
    floor = max(interval.ci_high - 1.0, 1.0 - interval.ci_low, 0.0)
    return {
        "ratio": interval.ratio,
        "ci_low": interval.ci_low,
        "ci_high": interval.ci_high,
        "noise_floor": floor,
        "seconds": ev.seconds,
    }


def _append_tsv(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row), delimiter="\t")
        if new:
            writer.writeheader()
        writer.writerow(row)


def _trial_record(trial) -> dict:
    return {
        "number": trial.number,
        "params": dict(trial.params),
        "state": trial.state.name,
        "status": trial.user_attrs.get("status"),
        "reasons": trial.user_attrs.get("reasons", []),
        "speedup": trial.user_attrs.get("speedup"),
    }


def run_loop(cfg: LoopConfig, on_event: Event = _quiet) -> LoopResult:
    started = time.monotonic()
    source = cfg.candidate.read_text()
    space = read_params_space(source) or {}
    study_name = f"{cfg.task.name}/{cfg.candidate.name}/{cfg.device}"
    study = open_study(cfg.store_url, study_name, space, cfg.seed)
    resumed = bool(study.get_trials(deepcopy=False))
    requeued = recover_orphans(study)
    if requeued:
        on_event("requeued", {"params": requeued})
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    tsv = cfg.out_dir / "results.tsv"

    incumbent = study.user_attrs.get("incumbent") or {"params": {}, "trial": None}
    noise = study.user_attrs.get("noise")
    if noise is None:
        on_event("calibrate", {"params": incumbent["params"]})
        noise = calibrate(cfg, incumbent["params"])
        study.set_user_attr("noise", noise)
    on_event("calibrated", noise)
    threshold = max(cfg.min_effect, noise["noise_floor"])

    proposer = SearchProposer(study, cfg.candidate, space, owner_tag())
    stop_reason = "trial budget reached"
    while True:
        done = len(proposer.finished_keys())
        if done >= cfg.trials:
            break
        proposal = proposer.propose()
        if proposal is None:
            stop_reason = "search space exhausted"
            break
        on_event(
            "trial",
            {
                "number": proposal.trial_number,
                "params": proposal.params,
                "done": done,
                "total": cfg.trials,
            },
        )
        outcome = _try(cfg, incumbent["params"], proposal, threshold)
        speed = outcome.speedup
        proposer.feedback(proposal, outcome)
        if outcome.status == "keep":
            incumbent = {
                "params": proposal.params,
                "trial": proposal.trial_number,
                "speedup": speed,
            }
            study.set_user_attr("incumbent", incumbent)
        _append_tsv(
            tsv,
            {
                "trial": proposal.trial_number,
                "params": " ".join(f"{k}={v}" for k, v in proposal.params.items()),
                "speedup": "" if speed is None else f"{speed['ratio']:.4f}",
                "ci_low": "" if speed is None else f"{speed['ci_low']:.4f}",
                "ci_high": "" if speed is None else f"{speed['ci_high']:.4f}",
                "verdict": "rejected" if outcome.status == "crash" else "accepted",
                "status": outcome.status,
                "description": proposal.description
                + ("" if not outcome.reasons else " [" + ", ".join(outcome.reasons) + "]"),
            },
        )
        on_event(
            "trial-done",
            {
                "number": proposal.trial_number,
                "status": outcome.status,
                "speedup": speed,
                "reasons": outcome.reasons,
            },
        )

    trials = [_trial_record(t) for t in study.get_trials(deepcopy=False)]
    rejected = Counter(code for t in trials if t["status"] == "crash" for code in t["reasons"])
    on_event("final", {"params": incumbent["params"]})
    final = final_comparison(cfg, incumbent["params"])
    rows = [
        {
            "shape": f["shape"],
            "dims": f["dims"],
            "source": f["winner"],
            "name": cfg.candidate.name if f["winner"] == "candidate" else f["best_peer"],
            "params": incumbent["params"] if f["winner"] == "candidate" else {},
            "speedup": f["speedup_vs_best_peer"],
        }
        for f in final
    ]
    dispatch = build_dispatch(cfg.task.name, cfg.task.bucket_key, rows)
    save_dispatch(dispatch, cfg.out_dir / f"dispatch-{cfg.task.name}.json")
    return LoopResult(
        task=cfg.task.name,
        candidate=str(cfg.candidate),
        study=study_name,
        store_url=cfg.store_url,
        resumed=resumed,
        stop_reason=stop_reason,
        noise=noise,
        incumbent=incumbent,
        trials=trials,
        rejected_by_reason=dict(rejected),
        final=final,
        dispatch=dispatch,
        seconds=time.monotonic() - started,
    )


def _try(cfg: LoopConfig, incumbent: dict, proposal: Proposal, threshold: float):
    specs = [
        CandidateSpec(cfg.candidate, incumbent, "incumbent"),
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
        return Outcome("crash", None, sorted({r.code for r in challenger.reasons}))
    if not ev.by_label("incumbent").accepted:
        raise LoopError(
            "the incumbent failed verification: "
            + "; ".join(r.message for r in ev.by_label("incumbent").reasons)
        )
    pairs, names = _pairs(ev, "incumbent", "challenger")
    interval = geomean_ratio_interval(pairs, _weights(cfg.task, cfg.device, names))
    speed = {"ratio": interval.ratio, "ci_low": interval.ci_low, "ci_high": interval.ci_high}
    keep = interval.ci_low > 1.0 + threshold
    return Outcome("keep" if keep else "discard", interval.ratio, speedup=speed)


def final_comparison(cfg: LoopConfig, params: dict) -> list[dict]:
    """The incumbent against every peer, interleaved, shape by shape."""
    spec = CandidateSpec(cfg.candidate, params, "candidate")
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
        raise LoopError(
            "the incumbent failed its final verification: "
            + "; ".join(r.message for r in cand.reasons)
        )
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
            interval = ratio_interval(best.shapes[shape.name].blocks_s, mine.blocks_s)
            row["best_peer"] = best.label
            row["speedup_vs_best_peer"] = {
                "ratio": interval.ratio,
                "ci_low": interval.ci_low,
                "ci_high": interval.ci_high,
            }
            if decide(interval, cfg.min_effect) != "faster":
                row["winner"] = "peer"
        rows.append(row)
    return rows


def _timing(result) -> dict:
    s = summarize(result.blocks_s)
    return {
        "median_s": s.median,
        "ci_low_s": s.ci_low,
        "ci_high_s": s.ci_high,
        "n_blocks": s.n,
        "n_samples": max(result.n_samples, s.n),
        "method": result.method or "host-clock",
    }

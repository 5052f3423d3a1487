"""`autotune report verify`: re-measure every claim of a report on this host, through the same
evaluator `autotune bench` uses, and judge each one (see `appliance.report.claims`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from appliance.report.claims import (
    DEFAULT_TOLERANCE,
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    ClaimResult,
    Measured,
    claims_of,
    environment_differences,
    judge,
)

Progress = Callable[[str], None]

# The most tolerance a report's own noise floor may ask for: the report under test does not get
# to set how loosely it is judged (--tolerance, the user's, may go up to 1).
MAX_REPORT_TOLERANCE = 0.5


@dataclass
class Verification:
    results: list[ClaimResult]
    notes: list[str]
    tolerance: float
    seconds: float = 0.0
    host: dict = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {
            s: sum(r.status == s for r in self.results)
            for s in (REPRODUCED, NOT_REPRODUCED, NOT_COMPARABLE)
        }

    @property
    def holds(self) -> bool:
        """Every comparable claim reproduced, and at least one claim was comparable."""
        counts = self.counts()
        return counts[NOT_REPRODUCED] == 0 and counts[REPRODUCED] > 0

    def to_dict(self) -> dict:
        return {
            "holds": self.holds,
            "counts": self.counts(),
            "tolerance": self.tolerance,
            "claims": [r.to_dict() for r in self.results],
            "notes": list(self.notes),
            "host": self.host,
            "seconds": self.seconds,
        }


def verify_report(
    doc: dict,
    *,
    here_fingerprint: dict | None = None,
    quick: bool = False,
    tolerance: float | None = None,
    progress: Progress | None = None,
) -> Verification:
    """Re-measure the claims of a current-version report (see `document.checked`) here."""
    import time

    from appliance.fingerprint import collect_fingerprint

    started = time.monotonic()
    here = here_fingerprint if here_fingerprint is not None else collect_fingerprint()
    if tolerance is None:
        floor = (doc.get("noise") or {}).get("noise_floor", 0.0)
        tolerance = min(max(DEFAULT_TOLERANCE, floor), MAX_REPORT_TOLERANCE)
    claims, notes = claims_of(doc)
    results: list[ClaimResult] = []
    for group in _groups(claims):
        differences = environment_differences(doc["fingerprint"], here, group[0].device)
        if differences:
            results += [judge(c, None, differences, tolerance) for c in group]
            continue
        if progress:
            shapes = ", ".join(c.shape for c in group)
            progress(f"re-measuring {group[0].task} {group[0].candidate} on {shapes}")
        measured, failure, changed = _measure(group, quick)
        for claim in group:
            results.append(
                judge(
                    claim, measured.get(claim.shape), changed, tolerance, failure.get(claim.shape)
                )
            )
    host = {
        "gpus": [g["name"] for g in here["gpus"]],
        "driver": here["versions"].get("driver"),
        "cpu_model": here["host"].get("cpu_model"),
        "hostname": here["host"].get("hostname"),
    }
    return Verification(results, notes, tolerance, time.monotonic() - started, host)


def _groups(claims: list[Claim]) -> list[list[Claim]]:
    """Claims that one evaluator call can re-measure: same task, device, candidate, params, and
    the same sha256 (each checked against the file: a group's first claim speaks for all)."""
    groups: dict[tuple, list[Claim]] = {}
    for c in claims:
        key = (c.task, c.device, c.candidate, json.dumps(c.params, sort_keys=True), c.sha256)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def _measure(
    group: list[Claim], quick: bool
) -> tuple[dict[str, Measured], dict[str, str], list[str]]:
    """(ratio per shape, why per unmeasured shape, differences that make the group incomparable)."""
    from baselines.stats import ratio_interval
    from loop.evaluator import QUICK_RULE, CandidateSpec, evaluate
    from loop.tasks import TaskError, available_tasks, kernels_root, load_task

    first = group[0]
    if first.task not in available_tasks():  # a name, never a folder the report points at
        return {}, {}, [f"task {first.task!r} is not one of this install's tasks"]
    try:
        task = load_task(kernels_root() / first.task)
    except TaskError as exc:
        return {}, {}, [f"task {first.task!r} is not available here: {exc}"]
    if Path(first.candidate).name != first.candidate or first.candidate in ("", ".", ".."):
        return {}, {}, [f"candidate {first.candidate!r} is not a file name in the task folder"]
    path = task.folder / f"{first.candidate}.py"
    if not path.is_file():
        return {}, {}, [f"candidate file {path} is not here"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if first.sha256 and digest != first.sha256:
        return {}, {}, [f"candidate {path.name} changed since the report (sha256 {digest[:12]})"]
    known = {s.name for s in task.shapes(first.device)}
    missing = [c.shape for c in group if c.shape not in known]
    shapes = list(dict.fromkeys(c.shape for c in group if c.shape in known))
    failures = {s: f"shape {s} is no longer in task {task.name}" for s in missing}
    if not shapes:
        return {}, failures, []
    peers = sorted({c.peer for c in group if c.peer in task.peers})
    ev = evaluate(
        task,
        [CandidateSpec(path, first.params, "candidate")],
        first.device,
        time_it=True,
        peers=peers,
        shapes=shapes,
        rule=QUICK_RULE if quick else None,
    )
    mine = ev.by_label("candidate")
    if not mine.accepted:
        why = "the candidate is rejected here: " + "; ".join(
            f"{r.code}: {r.message}" for r in mine.reasons
        )
        return {}, {**failures, **dict.fromkeys(shapes, why)}, []
    measured: dict[str, Measured] = {}
    for claim in group:
        if claim.shape not in shapes:
            continue
        peer = next((v for v in ev.verdicts if v.kind == "peer" and v.label == claim.peer), None)
        theirs = peer.shapes.get(claim.shape) if peer and peer.accepted else None
        ours = mine.shapes.get(claim.shape)
        if theirs is None or not theirs.blocks_s or ours is None or not ours.blocks_s:
            failures[claim.shape] = f"peer {claim.peer} could not be timed here"
            continue
        r = ratio_interval(theirs.blocks_s, ours.blocks_s)
        measured[claim.shape] = Measured(r.ratio, r.ci_low, r.ci_high, r.n)
    return measured, failures, []

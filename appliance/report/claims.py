"""The claims a report makes, and the pure judgement of a claim against a re-measurement.

A claim is "on this task and shape, this candidate with these parameters is r x [lo, hi] as fast
as this peer". `judge` decides, without measuring anything: reproduced (the re-measured interval
overlaps the claimed one, counted no wider than the re-measurement's and widened by a
tolerance), not reproduced (both numbers given), or not comparable (a different GPU, driver or
CPU, or a changed candidate file, saying which). Besides each shape's claim about its incumbent,
a winning candidate whose shown speedup differs makes a claim of its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not-reproduced"
NOT_COMPARABLE = "not-comparable"
DEFAULT_TOLERANCE = 0.01


@dataclass(frozen=True)
class Claim:
    task: str
    shape: str
    device: str
    candidate: str  # file stem in the task folder
    params: dict
    peer: str
    ratio: float  # peer time / candidate time
    ci_low: float
    ci_high: float
    basis: str  # "measured-ratio" (interleaved) or "time-intervals" (derived from two times)
    sha256: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Measured:
    ratio: float
    ci_low: float
    ci_high: float
    n_blocks: int | None = None


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    status: str
    why: str
    measured: Measured | None = None

    def to_dict(self) -> dict:
        return {
            **self.claim.to_dict(),
            "status": self.status,
            "why": self.why,
            "measured": None if self.measured is None else asdict(self.measured),
        }


def claims_of(doc: dict) -> tuple[list[Claim], list[str]]:
    """The claims of a current-version report, and a note for each shape that makes none."""
    claims, notes = [], []
    for task in doc["tasks"]:
        fallback = _task_candidate(task)
        for shape in task["shapes"]:
            claim, note = _shape_claim(task, shape, fallback)
            if claim:
                claims.append(claim)
                winner = _winner_claim(shape, claim)
                if winner is not None:
                    claims.append(winner)
            else:
                notes.append(f"{task['task']} {shape['name']}: {note}")
    return claims, notes


def _task_candidate(task: dict) -> dict | None:
    """The candidate and params the task's dispatch table names (one incumbent per task)."""
    for entry in task["dispatch"]:
        if entry["source"] == "candidate":
            return {"candidate": entry["candidate"], "params": entry["params"]}
    return None


def _shape_claim(task: dict, shape: dict, fallback: dict | None) -> tuple[Claim | None, str]:
    peers = shape["peers"]
    winner = shape["winner"]
    won = winner is not None and winner["candidate"] not in peers
    spec = shape.get("incumbent_spec")
    ratio = shape.get("incumbent_speedup_vs_best_peer")
    mine = shape["incumbent"]
    if spec is None and won:
        spec = {k: winner.get(k) for k in ("candidate", "params", "sha256")}
        ratio, mine = winner["speedup_vs_best_peer"], winner["timing"]
    spec = spec or fallback
    if not peers:
        return None, "no peer was timed"
    if spec is None:
        return None, "the report does not name the candidate and parameters timed here"
    peer = shape.get("best_peer") or min(peers, key=lambda p: peers[p]["median_s"])
    basis = "measured-ratio"
    if ratio is None:
        if mine is None:
            return None, "no candidate time was measured"
        ratio, basis = _ratio_from_times(peers[peer], mine), "time-intervals"
    return (
        Claim(
            task=task["task"],
            shape=shape["name"],
            device=task["device"],
            candidate=spec["candidate"],
            params=dict(spec["params"]),
            peer=peer,
            ratio=ratio["ratio"],
            ci_low=ratio["ci_low"],
            ci_high=ratio["ci_high"],
            basis=basis,
            sha256=spec.get("sha256"),
        ),
        "",
    )


def _winner_claim(shape: dict, claim: Claim) -> Claim | None:
    """The speedup the report shows for the shape's winning candidate, where it is not the claim
    already made: it is checked too, not only the incumbent's."""
    winner = shape["winner"]
    if winner is None or winner["candidate"] in shape["peers"]:
        return None
    speedup = winner["speedup_vs_best_peer"]
    if speedup is None:
        return None
    same_spec = (winner["candidate"], winner["params"]) == (claim.candidate, claim.params)
    own = replace(
        claim,
        candidate=winner["candidate"],
        params=dict(winner["params"]),
        ratio=speedup["ratio"],
        ci_low=speedup["ci_low"],
        ci_high=speedup["ci_high"],
        basis="measured-ratio",
        # the incumbent's file where the winner is the same candidate: one group, one measurement
        sha256=winner.get("sha256") or (claim.sha256 if same_spec else None),
    )
    return None if own == claim else own


def _ratio_from_times(peer: dict, mine: dict) -> dict:
    """peer / mine from two separately measured times: a conservative interval."""
    return {
        "ratio": peer["median_s"] / mine["median_s"],
        "ci_low": peer["ci_low_s"] / mine["ci_high_s"],
        "ci_high": peer["ci_high_s"] / mine["ci_low_s"],
    }


def environment_differences(report_fp: dict, here_fp: dict, device: str) -> list[str]:
    """What makes a re-measurement here incomparable with the report, one phrase each."""
    if device == "cuda":
        theirs = [g["name"] for g in report_fp["gpus"]]
        mine = [g["name"] for g in here_fp["gpus"]]
        if not mine:
            return [f"no GPU on this host (the report ran on {', '.join(theirs) or 'a GPU'})"]
        if not theirs:
            return ["the report names no GPU for its GPU claims"]
        out = []
        if theirs[0] != mine[0]:
            out.append(f"GPU: report {theirs[0]}, here {mine[0]}")
        drivers = report_fp["versions"].get("driver"), here_fp["versions"].get("driver")
        if drivers[0] != drivers[1]:
            out.append(f"driver: report {drivers[0]}, here {drivers[1]}")
        return out
    cpus = report_fp["host"].get("cpu_model"), here_fp["host"].get("cpu_model")
    return [f"CPU: report {cpus[0]}, here {cpus[1]}"] if cpus[0] != cpus[1] else []


def judge(
    claim: Claim,
    measured: Measured | None,
    differences: list[str],
    tolerance: float = DEFAULT_TOLERANCE,
    failure: str | None = None,
) -> ClaimResult:
    """Reproduced, not reproduced or not comparable; `failure` says why nothing was measured."""
    if differences:
        return ClaimResult(claim, NOT_COMPARABLE, "; ".join(differences), measured)
    claimed = _fmt(claim.ratio, claim.ci_low, claim.ci_high)
    if measured is None:
        return ClaimResult(claim, NOT_REPRODUCED, f"claimed {claimed}; {failure or 'not measured'}")
    got = _fmt(measured.ratio, measured.ci_low, measured.ci_high)
    # The claimed interval counts no wider, relative to its ratio, than the re-measurement's own:
    # a report's interval is its own word, and a wide one would overlap anything.
    low = max(claim.ci_low, claim.ratio * measured.ci_low / measured.ratio) / (1 + tolerance)
    high = min(claim.ci_high, claim.ratio * measured.ci_high / measured.ratio) * (1 + tolerance)
    if measured.ci_low <= high and measured.ci_high >= low:
        return ClaimResult(claim, REPRODUCED, f"claimed {claimed}, measured {got}", measured)
    return ClaimResult(claim, NOT_REPRODUCED, f"claimed {claimed}, measured {got}", measured)


def _fmt(ratio: float, lo: float, hi: float) -> str:
    return f"{ratio:.3f}x [{lo:.3f}, {hi:.3f}]"

"""Proposers: give me the next candidate (source file and params), take the verdict.

Every proposer opens one Optuna trial per proposal (the experiment's record in the store) and
claims the proposal's configuration in the ledger first, so no two processes on one store
evaluate the same configuration. Built in: `SearchProposer` here (Optuna ask/tell over PARAMS:
a grid for small spaces, TPE above), `loop.scripted.ScriptedProposer` and
`loop.agent.AgentProposer`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import optuna

if TYPE_CHECKING:
    from loop.store import Ledger

GRID_LIMIT = 64


@dataclass
class Proposal:
    path: Path
    params: dict
    description: str
    trial_number: int | None = None
    extra: dict = field(default_factory=dict)
    kind: str = "search"
    key: str = ""
    trial: optuna.trial.Trial | None = None
    error: str | None = None  # the proposal could not be made (a patch that does not apply)


@dataclass
class Outcome:
    status: str  # keep, discard, crash (rejected)
    score: float | None  # geometric-mean speedup over the incumbent
    reasons: list[str] = field(default_factory=list)
    speedup: dict | None = None  # ratio, ci_low, ci_high against the incumbent
    messages: list[str] = field(default_factory=list)
    shapes: dict = field(default_factory=dict)  # shape -> challenger's median seconds


class Proposer(Protocol):
    kind: str

    def propose(self) -> Proposal | None: ...

    def feedback(self, proposal: Proposal, outcome: Outcome) -> None: ...


def space_size(space: dict) -> int:
    return math.prod(len(v) for v in space.values()) if space else 1


def params_key(params: dict) -> str:
    return repr(sorted(params.items()))


def source_key(source: str, params: dict) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:32]
    return f"source:{digest}:{params_key(params)}"


def open_trial(study: optuna.Study, owner: str, kind: str) -> optuna.trial.Trial:
    trial = study.ask()
    trial.set_user_attr("owner", owner)
    trial.set_user_attr("kind", kind)
    return trial


def drop_trial(study: optuna.Study, trial: optuna.trial.Trial, status: str) -> None:
    """A trial that is not an experiment (its configuration was taken): kept out of every count."""
    trial.set_user_attr("status", status)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)


class SearchProposer:
    """Optuna ask/tell over PARAMS; the study lives in the experiment store."""

    kind = "search"

    def __init__(
        self, study: optuna.Study, path: Path, space: dict, owner: str, ledger: Ledger
    ) -> None:
        self.study = study
        self.owner = owner
        self.path = path
        self.space = space
        self.ledger = ledger

    def _taken(self) -> int:
        return sum(1 for key in self.ledger.claimed() if key.startswith("params:"))

    def propose(self) -> Proposal | None:
        size = space_size(self.space)
        for _ in range(4 * size + 8):
            if self._taken() >= size:
                return None
            trial = open_trial(self.study, self.owner, self.kind)
            params = {
                name: trial.suggest_categorical(name, choices)
                for name, choices in self.space.items()
            }
            key = "params:" + params_key(params)
            if not self.ledger.claim(key, trial.number, self.owner):
                drop_trial(self.study, trial, "duplicate")
                continue
            text = ", ".join(f"{k}={v}" for k, v in params.items())
            return Proposal(
                self.path,
                params,
                f"{self.path.name} {text}".strip(),
                trial.number,
                kind=self.kind,
                key=key,
                trial=trial,
            )
        return None

    def feedback(self, proposal: Proposal, outcome: Outcome) -> None:
        return None


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, minus its `study.stop()` once the grid is covered: that call only works
    inside `optimize`, and the loop (ask/tell) sees exhaustion itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


SAMPLERS = ("auto", "grid", "tpe", "gp", "random")


def make_sampler(
    space: dict, seed: int | None = None, kind: str = "auto"
) -> optuna.samplers.BaseSampler:
    """auto: the grid for spaces up to GRID_LIMIT configurations, TPE above."""
    if kind not in SAMPLERS:
        raise ValueError(f"unknown sampler {kind!r}: one of {', '.join(SAMPLERS)}")
    if kind == "grid" or (kind == "auto" and space and space_size(space) <= GRID_LIMIT):
        return _GridSampler(space, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def all_configs(space: dict) -> list[dict]:
    names = list(space)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*space.values())]

"""Proposers: give me the next candidate (source file and params), take the verdict.

`SearchProposer` runs Optuna ask/tell over a candidate's PARAMS: a grid for small spaces, TPE
above. Configurations already finished in the study (by any process) are never proposed again.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import optuna

GRID_LIMIT = 64


@dataclass
class Proposal:
    path: Path
    params: dict
    description: str
    trial_number: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Outcome:
    status: str  # keep, discard, crash (rejected)
    score: float | None  # geometric-mean speedup over the incumbent
    reasons: list[str] = field(default_factory=list)
    speedup: dict | None = None  # ratio, ci_low, ci_high against the incumbent


class Proposer(Protocol):
    def propose(self) -> Proposal | None: ...

    def feedback(self, proposal: Proposal, outcome: Outcome) -> None: ...


def space_size(space: dict) -> int:
    return math.prod(len(v) for v in space.values()) if space else 1


def params_key(params: dict) -> str:
    return repr(sorted(params.items()))


class SearchProposer:
    """Optuna ask/tell over PARAMS; the study lives in the experiment store."""

    def __init__(self, study: optuna.Study, path: Path, space: dict, owner: str = "") -> None:
        self.study = study
        self.owner = owner
        self.path = path
        self.space = space
        self._pending: dict[int, optuna.trial.Trial] = {}

    def finished_keys(self) -> set[str]:
        done = {
            optuna.trial.TrialState.COMPLETE,
            optuna.trial.TrialState.FAIL,
            optuna.trial.TrialState.PRUNED,
        }
        return {
            params_key(t.params)
            for t in self.study.get_trials(deepcopy=False)
            if t.state in done and t.user_attrs.get("status") != "interrupted"
        }

    def exhausted(self) -> bool:
        return len(self.finished_keys()) >= space_size(self.space)

    def propose(self) -> Proposal | None:
        seen = self.finished_keys()
        for _ in range(4 * space_size(self.space)):
            if len(seen) >= space_size(self.space):
                return None
            trial = self.study.ask()
            params = {
                name: trial.suggest_categorical(name, choices)
                for name, choices in self.space.items()
            }
            if params_key(params) in seen:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                seen.add(params_key(params))
                continue
            trial.set_user_attr("owner", self.owner)
            self._pending[trial.number] = trial
            text = ", ".join(f"{k}={v}" for k, v in params.items())
            return Proposal(self.path, params, f"{self.path.name} {text}", trial.number)
        return None

    def feedback(self, proposal: Proposal, outcome: Outcome) -> None:
        trial = self._pending.pop(proposal.trial_number)
        trial.set_user_attr("status", outcome.status)
        trial.set_user_attr("reasons", outcome.reasons)
        trial.set_user_attr("speedup", outcome.speedup)
        if outcome.score is None:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, outcome.score)


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, minus its `study.stop()` once the grid is covered: that call only works
    inside `optimize`, and the loop (ask/tell) sees exhaustion itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(space: dict, seed: int | None = None) -> optuna.samplers.BaseSampler:
    if space and space_size(space) <= GRID_LIMIT:
        return _GridSampler(space, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def all_configs(space: dict) -> list[dict]:
    names = list(space)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*space.values())]

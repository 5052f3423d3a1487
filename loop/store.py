"""The experiment store: one Optuna study per task and candidate file, in SQLite by default or
PostgreSQL by URL. Trials hold every experiment (params, verdict, reasons, timings); study
attributes hold the incumbent and the noise calibration, so a killed loop resumes from them."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import optuna
from optuna.trial import TrialState

from loop.proposers import make_sampler

DEFAULT_DIR = Path(".autotune")


class StoreError(Exception):
    """A store URL that cannot be opened or written."""


def default_store_url(base: Path = DEFAULT_DIR) -> str:
    return f"sqlite:///{(base / 'experiments.sqlite3').resolve()}"


def open_study(url: str, name: str, space: dict, seed: int | None = None) -> optuna.Study:
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise StoreError(f"cannot write the store {path}: {exc.strerror}") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        return optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=make_sampler(space, seed),
            direction="maximize",
            load_if_exists=True,
        )
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"cannot open the store {url}: {type(exc).__name__}: {exc}") from exc


def owner_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(tag: str) -> bool:
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's trial: not ours to judge
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def recover_orphans(study: optuna.Study) -> list[dict]:
    """Trials left RUNNING by a killed process on this host: failed, and their params re-queued
    so the experiment is run again exactly once. Returns the re-queued params."""
    requeued = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tag = trial.user_attrs.get("owner", "")
        if tag and _alive(tag):
            continue
        study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        if trial.params:
            study.enqueue_trial(trial.params)
            requeued.append(dict(trial.params))
    return requeued

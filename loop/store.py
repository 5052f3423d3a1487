"""The experiment store: one Optuna study per task, candidate file and proposer, in SQLite by
default or PostgreSQL by URL. Trials hold every experiment (proposal, params, verdict, reasons,
timings); study attributes hold the noise calibration.

Beside Optuna's tables, a small ledger makes several processes on one store safe:
- claims: one row per configuration (parameters or source), inserted before it is evaluated, so
  two processes never evaluate the same configuration (the primary key decides who got it);
- incumbents: the current best per study with a version, swapped only by compare-and-set, so
  every process agrees on the incumbent and a keep measured against a stale one is re-measured.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from loop.proposers import make_sampler

DEFAULT_DIR = Path(".autotune")
# A RUNNING trial without an owner is a process killed between `ask` and tagging its trial; one
# younger than this may still be tagged by a live process on another host.
UNTAGGED_GRACE_S = 120.0


class StoreError(Exception):
    """A store URL that cannot be opened or written."""


def default_store_url(base: Path = DEFAULT_DIR) -> str:
    return f"sqlite:///{(base / 'experiments.sqlite3').resolve()}"


def normalize_url(url: str) -> str:
    """`postgresql://` means psycopg 3 here (the driver installed), not SQLAlchemy's psycopg2."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _check_sqlite(url: str) -> None:
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise StoreError(f"cannot write the store {path}: {exc.strerror}") from exc


def open_study(
    url: str, name: str, space: dict, seed: int | None = None, sampler: str = "auto"
) -> optuna.Study:
    url = normalize_url(url)
    _check_sqlite(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(4):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
            return _create(storage, name, space, seed, sampler)
        except (
            optuna.exceptions.DuplicatedStudyError,
            sa.exc.IntegrityError,
            sa.exc.ProgrammingError,
        ) as exc:
            # another process created the schema or the study at the same moment
            if attempt == 3:
                raise StoreError(f"cannot open the store {url}: {exc}") from exc
            time.sleep(0.2 * (attempt + 1))
        except Exception as exc:
            raise StoreError(f"cannot open the store {url}: {type(exc).__name__}: {exc}") from exc
    raise AssertionError("unreachable")


def _create(storage, name: str, space: dict, seed: int | None, sampler: str) -> optuna.Study:
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(space, seed, sampler),
        direction="maximize",
        load_if_exists=True,
    )


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


_META = sa.MetaData()
CLAIMS = sa.Table(
    "autotune_claims",
    _META,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("key", sa.String(512), primary_key=True),
    sa.Column("trial", sa.Integer, nullable=True),
    sa.Column("owner", sa.String(300), nullable=False),
    sa.Column("commit", sa.String(64), nullable=True),
)
INCUMBENTS = sa.Table(
    "autotune_incumbents",
    _META,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("value", sa.Text, nullable=False),
)


@dataclass
class Incumbent:
    version: int
    value: dict  # source, params, trial, speedup, shapes (median s), description


class Ledger:
    """Claims and the versioned incumbent of one study, in the store's own database."""

    def __init__(self, url: str, study: str) -> None:
        self.study = study
        url = normalize_url(url)
        try:
            self.engine = sa.create_engine(url, pool_pre_ping=True)
            try:
                _META.create_all(self.engine)
            except sa.exc.SQLAlchemyError:  # created by another process at the same moment
                time.sleep(0.3)
                _META.create_all(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot open the store {url}: {type(exc).__name__}: {exc}") from exc

    def claim(self, key: str, trial: int | None, owner: str) -> bool:
        """True when this process got `key`; False when some process claimed it before."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    CLAIMS.insert().values(study=self.study, key=key, trial=trial, owner=owner)
                )
            return True
        except sa.exc.IntegrityError:
            return False

    def release_trial(self, trial: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                CLAIMS.delete().where(CLAIMS.c.study == self.study, CLAIMS.c.trial == trial)
            )

    def bind(self, key: str, trial: int) -> None:
        """Tie a claim made before its trial existed (a budget slot) to that trial."""
        with self.engine.begin() as conn:
            conn.execute(
                CLAIMS.update()
                .where(CLAIMS.c.study == self.study, CLAIMS.c.key == key)
                .values(trial=trial)
            )

    def release(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(CLAIMS.delete().where(CLAIMS.c.study == self.study, CLAIMS.c.key == key))

    def take_slot(self, budget: int, owner: str) -> str | None:
        """One of `budget` trial slots (`slot:<i>`), so processes sharing a study never run more
        experiments than the budget between them; None when all are taken."""
        claimed = self.claimed()
        for i in range(budget):
            key = f"slot:{i}"
            if key not in claimed and self.claim(key, None, owner):
                return key
        return None

    def release_dead_unbound(self) -> None:
        """Claims of killed processes on this host that never got a trial."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(CLAIMS.c.key, CLAIMS.c.owner).where(
                    CLAIMS.c.study == self.study, CLAIMS.c.trial.is_(None)
                )
            ).all()
        for key, owner in rows:
            if not _alive(owner):
                self.release(key)

    def claimed(self) -> dict[str, int | None]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(CLAIMS.c.key, CLAIMS.c.trial).where(CLAIMS.c.study == self.study)
            )
            return {key: trial for key, trial in rows}

    def set_commit(self, trial: int, commit: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                CLAIMS.update()
                .where(
                    CLAIMS.c.study == self.study,
                    CLAIMS.c.trial == trial,
                    CLAIMS.c.commit.is_(None),
                )
                .values(commit=commit)
            )

    def commits(self) -> dict[int, str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(CLAIMS.c.trial, CLAIMS.c.commit).where(
                    CLAIMS.c.study == self.study, CLAIMS.c.commit.is_not(None)
                )
            )
            return {trial: commit for trial, commit in rows}

    def incumbent(self, start: dict) -> Incumbent:
        """The study's incumbent; `start` (version 0) when the study has none yet."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    INCUMBENTS.insert().values(study=self.study, version=0, value=json.dumps(start))
                )
        except sa.exc.IntegrityError:
            pass
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(INCUMBENTS.c.version, INCUMBENTS.c.value).where(
                    INCUMBENTS.c.study == self.study
                )
            ).one()
        return Incumbent(row.version, json.loads(row.value))

    def swap_incumbent(self, version: int, value: dict) -> Incumbent | None:
        """Compare-and-set: the new incumbent when the stored one is still `version`, else None."""
        with self.engine.begin() as conn:
            done = conn.execute(
                INCUMBENTS.update()
                .where(INCUMBENTS.c.study == self.study, INCUMBENTS.c.version == version)
                .values(version=version + 1, value=json.dumps(value))
            )
        return Incumbent(version + 1, value) if done.rowcount == 1 else None


def recover_orphans(
    study: optuna.Study, ledger: Ledger | None = None, start: dict | None = None
) -> list[dict]:
    """Trials left RUNNING by a killed process on this host: marked interrupted and failed,
    their claims released, and search parameters re-queued, so the experiment is run again
    exactly once. A trial killed after its keep reached the incumbent record is completed from
    that record instead. Returns the re-queued params ({} for a re-offered non-search proposal).
    """
    requeued = []
    now = datetime.datetime.now()
    kept = ledger.incumbent(start or {}).value if ledger is not None else {}
    if ledger is not None:
        ledger.release_dead_unbound()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tag = trial.user_attrs.get("owner", "")
        if tag and _alive(tag):
            continue
        if (
            not tag
            and trial.datetime_start
            and ((now - trial.datetime_start).total_seconds() < UNTAGGED_GRACE_S)
        ):
            continue
        if kept.get("trial") == trial.number and kept.get("status") == "keep":
            for key in ("status", "speedup", "shapes", "description"):
                study._storage.set_trial_user_attr(trial._trial_id, key, kept.get(key))
            study._storage.set_trial_user_attr(trial._trial_id, "reasons", [])
            study._storage.set_trial_state_values(
                trial._trial_id, TrialState.COMPLETE, values=[kept["score"]]
            )
            continue
        study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        if ledger is not None:
            ledger.release_trial(trial.number)
        if trial.params:
            study.enqueue_trial(trial.params)
        requeued.append(dict(trial.params))
    return requeued

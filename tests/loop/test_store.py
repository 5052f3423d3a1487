"""The store's ledger on SQLite and on a real PostgreSQL server: a configuration is claimed by
exactly one process, the incumbent is swapped only by compare-and-set, and a killed trial is
recovered (interrupted and re-offered, or completed when its keep reached the incumbent)."""

from __future__ import annotations

import multiprocessing
import re
from pathlib import Path

import optuna
import pytest

from loop.store import Ledger, StoreError, normalize_url, open_study, recover_orphans

START = {"source": "x = 1\n", "params": {}, "trial": None}


def _urls(tmp_path: Path, request) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(tmp_path: Path, request) -> str:
    return _urls(tmp_path, request)


@pytest.fixture
def name(request) -> str:
    """A study name of this test alone: the PostgreSQL database is shared by the session."""
    return re.sub(r"\W", "-", request.node.name)


def _claim_many(url: str, study: str, keys: list[str], out) -> None:
    ledger = Ledger(url, study)
    out.put([k for k in keys if ledger.claim(k, None, "proc")])


def test_each_key_is_claimed_by_exactly_one_process(url: str, request) -> None:
    study = f"claims-{request.node.callspec.id}"
    keys = [f"params:{i}" for i in range(30)]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_many, args=(url, study, keys, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sorted(got[0] + got[1]) == sorted(keys)
    assert not set(got[0]) & set(got[1])
    assert set(Ledger(url, study).claimed()) == set(keys)


def test_incumbent_swaps_only_from_the_version_it_was_measured_against(url: str, name: str) -> None:
    ledger = Ledger(url, name)
    first = ledger.incumbent(START)
    assert first.version == 0 and first.value == START
    won = ledger.swap_incumbent(0, {"source": "a", "trial": 1})
    lost = ledger.swap_incumbent(0, {"source": "b", "trial": 2})
    assert won is not None and won.version == 1
    assert lost is None
    now = Ledger(url, name).incumbent({"source": "ignored"})
    assert now.version == 1 and now.value["source"] == "a"


def test_a_dead_owners_trial_is_interrupted_and_its_claim_released(url: str, name: str) -> None:
    study = open_study(url, name, {"n": [1, 2, 3]})
    ledger = Ledger(url, name)
    trial = study.ask()
    trial.suggest_categorical("n", [1, 2, 3])
    import socket

    trial.set_user_attr("owner", f"{socket.gethostname()}:999999999")
    assert ledger.claim("params:x", trial.number, "dead")
    requeued = recover_orphans(study, ledger, START)
    assert requeued == [dict(trial.params)]
    frozen = study.get_trials(deepcopy=False)[trial.number]
    assert frozen.state == optuna.trial.TrialState.FAIL
    assert frozen.user_attrs["status"] == "interrupted"
    assert "params:x" not in ledger.claimed()
    assert study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))


def test_a_trial_killed_after_its_keep_is_completed_from_the_incumbent(url: str, name: str) -> None:
    import socket

    study = open_study(url, name, {})
    ledger = Ledger(url, name)
    trial = study.ask()
    trial.set_user_attr("owner", f"{socket.gethostname()}:999999999")
    ledger.claim("step:0", trial.number, "dead")
    ledger.incumbent(START)
    value = {"source": "y", "trial": trial.number, "status": "keep", "score": 1.5}
    assert ledger.swap_incumbent(0, value | {"speedup": {"ratio": 1.5}})
    assert recover_orphans(study, ledger, START) == []
    frozen = study.get_trials(deepcopy=False)[trial.number]
    assert frozen.state == optuna.trial.TrialState.COMPLETE and frozen.value == 1.5
    assert frozen.user_attrs["status"] == "keep"
    assert "step:0" in ledger.claimed()


def test_urls_and_errors(tmp_path: Path) -> None:
    assert normalize_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(StoreError, match="cannot write the store"):
        open_study(f"sqlite:///{blocked}/sub/store.db", "s", {})

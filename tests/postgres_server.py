"""A real PostgreSQL 15 server for the store and fleet tests, started once per session in a temp
dir on a unix socket (the `postgres_url` fixture, registered in tests/conftest.py). initdb
refuses root, so as root the server runs as the `postgres` user."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A SQLAlchemy URL (`postgresql+psycopg://`) of a running PostgreSQL 15 server."""
    if not (PG_BIN / "initdb").is_file() or not (PG_BIN / "pg_ctl").is_file():
        pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN}/initdb, pg_ctl)")
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server")
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    if os.geteuid() == 0:
        os.chown(root, user.pw_uid, user.pw_gid)
    data, port = root / "data", _free_port()
    subprocess.run(
        _as_server_user(
            [str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]
        ),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses='' -c fsync=off -c max_connections=100"
    subprocess.run(
        _as_server_user(
            [
                *(str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options),
                *("-l", str(root / "log"), "-w", "start"),
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={root}&port={port}"
    finally:
        subprocess.run(
            _as_server_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def create_database(url: str, name: str) -> str:
    """A new empty database on the server of `url`; returns its URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    query = parsed.query
    with psycopg.connect(
        host=query["host"], port=query["port"], user=parsed.username, dbname=parsed.database,
        autocommit=True,
    ) as conn:  # fmt: skip
        conn.execute(f'CREATE DATABASE "{name}"')
    return parsed.set(database=name).render_as_string(hide_password=False)

"""One SSH connection per host (fabric), with host keys checked against known_hosts, connect
and command time limits, quoted remote commands, and every failure turned into a status and a
reason a person can act on."""

from __future__ import annotations

import shlex
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut
from paramiko.config import SSHConfig

from appliance.fleet.inventory import DEFAULT_KNOWN_HOSTS, Host

# Remote commands are wrapped in coreutils `timeout`, so that a command past its limit is killed
# on the host too, not only abandoned by the local side; TIMEOUT_EXIT is what `timeout` returns.
TIMEOUT_EXIT = 124
KILL_AFTER_S = 10
LOCAL_GRACE_S = 30


@dataclass(frozen=True)
class SshOptions:
    """How every connection of one fleet command is made."""

    known_hosts: Path = DEFAULT_KNOWN_HOSTS
    trust_new_host_keys: bool = False
    connect_timeout: float | None = None
    command_timeout: float | None = None


@dataclass(frozen=True)
class Completed:
    exit_code: int
    stdout: str
    stderr: str


class HostFailure(Exception):
    """A host that could not do its part: `status` is one of STATUSES, `reason` one sentence."""

    def __init__(self, status: str, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.exit_code = exit_code


STATUSES = ("ok", "failed", "timeout", "unreachable", "host-key", "auth", "error")
DEFAULT_CONNECT_TIMEOUT_S = 10.0

_known_hosts_lock = threading.Lock()


class _TrustNewHostKey(paramiko.MissingHostKeyPolicy):
    """Accept a host absent from known_hosts and record its key there (--trust-new-host-keys).

    Only unknown hosts come here: paramiko refuses a key that differs from a recorded one
    before any policy is asked.
    """

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        entry = paramiko.hostkeys.HostKeyEntry([hostname], key)
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with self.known_hosts.open("a") as fh:
                fh.write(entry.to_line())
        client.get_host_keys().add(hostname, key.get_name(), key)


def connect_timeout(host: Host, opts: SshOptions) -> float:
    return opts.connect_timeout or host.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S


def command_timeout(host: Host, opts: SshOptions, default: float) -> float:
    return opts.command_timeout or host.command_timeout or default


@contextmanager
def open_connection(host: Host, opts: SshOptions) -> Iterator[Connection]:
    """An open fabric Connection to `host`; failures to connect raise HostFailure."""
    timeout = connect_timeout(host, opts)
    connect_kwargs: dict = {"banner_timeout": timeout, "auth_timeout": timeout}
    if host.key is not None:
        connect_kwargs.update(key_filename=[str(host.key)], look_for_keys=False, allow_agent=False)
    # An explicit, empty SSHConfig: the hosts file is the whole truth, ~/.ssh/config is not read.
    config = Config(ssh_config=SSHConfig(), lazy=True)
    conn = Connection(
        host.host,
        user=host.user,
        port=host.port,
        config=config,
        connect_timeout=int(max(1, round(timeout))),
        connect_kwargs=connect_kwargs,
    )
    known = opts.known_hosts.expanduser()
    if known.is_file():
        conn.client.load_host_keys(str(known))
    conn.client.set_missing_host_key_policy(
        _TrustNewHostKey(known) if opts.trust_new_host_keys else paramiko.RejectPolicy()
    )
    try:
        conn.open()
    except Exception as exc:
        conn.close()
        raise connect_failure(exc, host, opts, timeout) from exc
    try:
        yield conn
    finally:
        conn.close()


def run_remote(
    conn: Connection,
    host: Host,
    argv: Sequence[str],
    timeout: float,
) -> Completed:
    """Run `argv` on the host, every word quoted, with the host's env and a time limit.

    A command past `timeout` raises HostFailure("timeout"); any exit status is returned.
    """
    words = ["timeout", "-k", str(KILL_AFTER_S), str(max(1, round(timeout)))]
    if host.env:
        words += ["env", *(f"{k}={v}" for k, v in sorted(host.env.items()))]
    command = shlex.join([*words, *argv])
    try:
        result = conn.run(
            command,
            hide=True,
            warn=True,
            in_stream=False,
            pty=False,
            timeout=timeout + KILL_AFTER_S + LOCAL_GRACE_S,
        )
    except CommandTimedOut as exc:
        raise HostFailure("timeout", f"{_name(argv)} timed out after {timeout:g} s") from exc
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise HostFailure("unreachable", f"connection lost during {_name(argv)}: {exc}") from exc
    if result.exited == TIMEOUT_EXIT:
        raise HostFailure(
            "timeout", f"{_name(argv)} timed out after {timeout:g} s (killed on the host)"
        )
    return Completed(result.exited, result.stdout, result.stderr)


def run_script(
    conn: Connection, host: Host, script: str, args: Sequence[str], timeout: float
) -> Completed:
    """Run a fixed POSIX `script` with user data only as its positional arguments ($1, $2...)."""
    return run_remote(conn, host, ["sh", "-c", script, "autotune-fleet", *args], timeout)


def failure_from(completed: Completed, what: str) -> HostFailure:
    """The failure for a command that exited non-zero, with the last line it printed."""
    last = _last_line(completed.stderr) or _last_line(completed.stdout) or "no output"
    return HostFailure(
        "failed", f"{what} failed (exit {completed.exit_code}): {last}", completed.exit_code
    )


def connect_failure(
    exc: BaseException, host: Host, opts: SshOptions, timeout: float
) -> HostFailure:
    """Classify why connecting to `host` failed."""
    where = f"{host.host}:{host.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostFailure(
            "host-key",
            f"host key of {where} changed ({exc.key.get_name()} {exc.key.fingerprint}, "
            f"known_hosts has {exc.expected_key.fingerprint}); refused: this may be an attack. "
            f"If the host was really reinstalled, remove the old entry "
            f"(ssh-keygen -R '[{host.host}]:{host.port}') and connect again",
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return HostFailure(
            "host-key",
            f"host key of {where} is not in {opts.known_hosts}; refused. Check the key "
            "(ssh-keyscan, the provider's console) and add it, or pass --trust-new-host-keys",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return HostFailure("auth", f"authentication to {where} failed: {exc}")
    if isinstance(exc, TimeoutError | socket.timeout):
        return HostFailure("timeout", f"connecting to {where} timed out after {timeout:g} s")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return HostFailure("unreachable", f"{where} refused the connection (is sshd running?)")
    if isinstance(exc, socket.gaierror):
        return HostFailure("unreachable", f"cannot resolve {host.host}: {exc.strerror}")
    if isinstance(exc, OSError):
        return HostFailure("unreachable", f"cannot connect to {where}: {exc.strerror or exc}")
    if isinstance(exc, paramiko.SSHException):
        return HostFailure("unreachable", f"SSH to {where} failed: {exc}")
    return HostFailure("error", f"connecting to {where}: {type(exc).__name__}: {exc}")


def _name(argv: Sequence[str]) -> str:
    words = list(argv)
    if words[:2] == ["sh", "-c"]:
        return "remote script"
    return " ".join([Path(words[0]).name, *words[1:3]]) if words else "command"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""

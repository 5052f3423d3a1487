"""Real OpenSSH servers for the fleet tests: one sshd per host, each on its own loopback address
and port, with generated host and user keys, running as the current user and killed after the
tests that started it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = shutil.which("ssh-keygen")


@dataclass
class Server:
    name: str
    address: str
    port: int
    root: Path
    host_key_line: str  # "ssh-ed25519 AAAA..." of this server's host key
    process: subprocess.Popen | None = None

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {self.host_key_line}\n"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def keygen(path: Path) -> str:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "fleet-test", "-f", str(path)],
        check=True,
    )
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _wait_listening(server: Server, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            err = server.process.stderr.read().decode(errors="replace")
            raise RuntimeError(f"sshd {server.name} exited: {err}")
        try:
            with socket.create_connection((server.address, server.port), timeout=0.5) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd {server.name} did not listen on {server.address}:{server.port}")


def start_sshd(name: str, address: str, root: Path, authorized_key: Path) -> Server:
    root.mkdir(parents=True, exist_ok=True)
    host_key = root / "host_ed25519"
    line = keygen(host_key)
    port = free_port(address)
    shutil.copy(authorized_key, root / "authorized_keys")
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {address}",
                f"HostKey {host_key}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "MaxStartups 100",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    server = Server(name, address, port, root, line)
    server.process = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_listening(server)
    except Exception:
        server.stop()
        raise
    return server


def _skip_without_sshd() -> None:
    if not SSHD.is_file() or SSH_KEYGEN is None:
        pytest.skip("needs OpenSSH (/usr/sbin/sshd and ssh-keygen; apt install openssh-server)")
    if os.geteuid() == 0:
        # sshd started as root wants its privilege separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


@pytest.fixture(scope="module")
def user_key(tmp_path_factory) -> Path:
    _skip_without_sshd()
    key = tmp_path_factory.mktemp("client") / "id_ed25519"
    keygen(key)
    return key


@pytest.fixture(scope="module")
def servers(tmp_path_factory, user_key) -> dict[str, Server]:
    """Three sshd servers (a, b, c) on 127.0.0.2-4, stopped when the module's tests end."""
    base = tmp_path_factory.mktemp("hosts")
    started: dict[str, Server] = {}
    try:
        for index, name in enumerate(("a", "b", "c")):
            started[name] = start_sshd(
                name, f"127.0.0.{index + 2}", base / name, user_key.with_suffix(".pub")
            )
        yield started
    finally:
        for server in started.values():
            server.stop()


def uv_binary() -> str:
    """The uv that runs these tests (`uv run` exports it as UV), else the first on PATH."""
    found = os.environ.get("UV") or shutil.which("uv")
    if not found:
        pytest.skip("needs uv to provision hosts")
    return os.path.realpath(found)


def uv_cache_dir(uv: str) -> str:
    return subprocess.run(
        [uv, "cache", "dir"], check=True, capture_output=True, text=True
    ).stdout.strip()


def base_python() -> str:
    return os.path.realpath(sys.executable)

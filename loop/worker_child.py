"""One forked child of the worker: run a body in it, bounded in time (and on the CPU in address
space), in its own process group that dies with it, and say how it ended.

The worker may serve many evaluations, so nothing a child starts may outlive the child: the
child leads a process group of its own, and the worker SIGKILLs that group when the child ends
(compiler workers, or whatever a candidate left behind). The evaluator is told of each group
before the child runs, so that it can kill the group too should the worker itself die.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Outcome:
    result: dict | None
    last_mark: tuple[str, str] | None
    failure: str | None  # None, "timeout", "out-of-memory" or "crash"
    message: str = ""


@dataclass
class ChildSettings:
    """What each child gets beyond its body: an address-space limit (CPU only: CUDA maps far more
    than it uses), the worker's private descriptors to close (the request and result pipes), and
    who to tell when a child's process group starts and ends."""

    memory_bytes: int | None = None
    private_fds: tuple[int, ...] = ()
    on_group: Callable[[int, bool], None] | None = field(default=None, repr=False)


class Channel:
    """The child's end of the pipe: progress marks, then one result. With a `token`, every line
    starts with it: candidate code in the child can write to the pipe (through /proc/self/fd),
    but it does not know the token, so the parent can tell the harness's lines from forged ones."""

    def __init__(self, fd: int, token: str = "") -> None:
        self.fd = fd
        self.prefix = f"{token} " if token else ""

    def send(self, obj: dict) -> None:
        data = (self.prefix + json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]

    def mark(self, label: str, shape: str) -> None:
        self.send({"mark": [label, shape]})


def kill_group(pgid: int) -> None:
    if pgid <= 1 or pgid == os.getpgrp():  # 0 would be the caller's own group
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _enter_child(settings: ChildSettings) -> None:
    os.setpgid(0, 0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd in settings.private_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if settings.memory_bytes:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = settings.memory_bytes
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_child(
    body: Callable[[Channel], dict], timeout_s: float, settings: ChildSettings | None = None
) -> Outcome:
    """Run `body` in a forked child; whatever the child does, return what it said and how it
    ended. The child never returns into the caller's code."""
    settings = settings or ChildSettings()
    token = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        status = 3
        try:
            os.close(read_fd)
            chan = Channel(write_fd, token)
            try:
                _enter_child(settings)
                chan.send({"result": body(chan)})
                status = 0
            except BaseException as exc:
                with contextlib.suppress(BaseException):
                    chan.send({"error": f"{type(exc).__name__}: {exc}"[:800]})
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(status)
    os.close(write_fd)
    # Both sides set the group, so it exists before either goes on (no race with the child).
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    buf, timed_out, status = b"", False, 0
    try:
        if settings.on_group is not None:
            settings.on_group(pid, True)
        buf, timed_out = _read_until_done(read_fd, pid, timeout_s)
    finally:
        os.close(read_fd)
        kill_group(pid)  # the child if it hangs, and anything it left behind
        # The child itself too: it may have moved into another group (its parent's, say).
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if settings.on_group is not None:
            settings.on_group(pid, False)
    return _outcome(buf, timed_out, status, timeout_s, token)


def _read_until_done(fd: int, pid: int, timeout_s: float) -> tuple[bytes, bool]:
    """What the child wrote, and whether it ran past `timeout_s`. Reading ends when the pipe
    closes, or when the child has exited while something it started still holds the pipe open
    (the child is left unreaped, so its process group cannot be reused before it is killed)."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return buf, True
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return buf, False
            buf += chunk
            continue
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            while select.select([fd], [], [], 0)[0] and (chunk := os.read(fd, 1 << 20)):
                buf += chunk
            return buf, False


def _outcome(
    buf: bytes, timed_out: bool, status: int, timeout_s: float, token: str = ""
) -> Outcome:
    """How the child ended, from what it wrote and its exit status. Every line must be the
    harness's (it starts with `token`) and hold one message, with at most one result: anything
    else was written by candidate code (a forged result, or a fragment that spoils the real
    one), and the child counts as crashed, blamed like any crash (`worker._supervised`)."""
    result, mark, error, forged, results = None, None, None, False, 0
    prefix = f"{token} " if token else ""
    for line in buf.decode(errors="replace").splitlines():
        if not line.startswith(prefix):
            forged = True
            continue
        try:
            msg = json.loads(line[len(prefix) :])
        except json.JSONDecodeError:
            forged = True
            continue
        if not isinstance(msg, dict):
            forged = True
        elif "mark" in msg:
            mark = tuple(msg["mark"])
        elif "result" in msg:
            result, results = msg["result"], results + 1
        elif "error" in msg:
            error = msg["error"]
    if timed_out:
        return Outcome(None, mark, "timeout", f"ran past {timeout_s:.0f} s")
    if forged or results > 1:
        return Outcome(None, mark, "crash", "its result pipe held lines the harness did not write")
    if result is not None:
        return Outcome(result, mark, None)
    if error is not None:
        oom = "MemoryError" in error or "out of memory" in error.lower()
        return Outcome(None, mark, "out-of-memory" if oom else "crash", error)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGKILL:  # the kernel's OOM killer, or memory limits
            return Outcome(None, mark, "out-of-memory", "killed (SIGKILL)")
        return Outcome(None, mark, "crash", f"died of signal {signal.Signals(sig).name}")
    return Outcome(None, mark, "crash", f"exited with status {os.WEXITSTATUS(status)}")

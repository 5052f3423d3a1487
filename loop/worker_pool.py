"""The evaluator's side of the worker process (loop/worker_serve.py): start it, send it one
request at a time, read its answer within a backstop, and keep it for the next evaluation.

A worker is kept per (interpreter, harness root, environment, device) and used by one
evaluation at a time: concurrent evaluations (threads) each take an idle worker or start their
own. A worker that dies, hangs past the backstop, answers with a wrong nonce or reports a harness
error is killed with every process group it started, and the next evaluation starts a fresh one.
`AUTOTUNE_WORKER_REUSE=0` makes every evaluation start and kill its own worker, as it once did.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from loop.reasons import Reason, reason
from loop.worker_child import kill_group

REUSE_ENV = "AUTOTUNE_WORKER_REUSE"
MAX_IDLE = 3  # idle workers kept in all; each holds torch in memory
STDERR_TAIL_BYTES = 64 * 1024
# Variables that change while nothing the worker does would (pytest's current test, the shell's
# working directory): a worker started under other values of these serves as well.
VOLATILE_ENV = ("PYTEST_CURRENT_TEST", "PWD", "OLDPWD", "_", "COLUMNS", "LINES")


def reuse_enabled() -> bool:
    """Whether evaluations keep their worker for the next one (default on)."""
    return os.environ.get(REUSE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class WorkerKey:
    python: str
    harness: str
    device: str
    env: tuple[tuple[str, str], ...]


@dataclass
class Reply:
    """A worker's answer to one request: the result, or why there is none."""

    result: dict
    failure: Reason | None
    worker_pid: int
    reused: bool
    stale: bool = False  # the answer was not to this request: the worker is not to be trusted


class _StderrTail:
    """Drains a worker's stderr (a full pipe would stall it) and keeps its last bytes."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._data = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True, name="worker-stderr")
        self._thread.start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: self._stream.read1(1 << 16), b""):
                with self._lock:
                    self._data += chunk
                    del self._data[:-STDERR_TAIL_BYTES]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def text(self, wait_s: float = 0.0) -> str:
        self._thread.join(wait_s)
        with self._lock:
            return self._data.decode(errors="replace")


@dataclass(eq=False)
class Worker:
    key: WorkerKey
    proc: subprocess.Popen
    results_fd: int
    stderr: _StderrTail
    home: tempfile.TemporaryDirectory
    served: int = 0
    groups: set[int] = field(default_factory=set)  # children's process groups now alive
    pending: bytes = b""
    stopped: bool = False


_lock = threading.Lock()
_idle: list[Worker] = []
_alive: set[Worker] = set()  # every worker this process started and has not stopped
_owner_pid = os.getpid()


def ask(request: dict, env: dict[str, str], memory_bytes: int | None, backstop_s: float) -> Reply:
    """Send `request` to a worker for this environment and device, and wait for its answer at
    most `backstop_s`. `memory_bytes` bounds the address space of a one-shot worker (CPU);
    each forked child is bounded by the request's own `cpu_memory_bytes` either way."""
    reuse = reuse_enabled()
    key = _key(request["harness"], request["device"], env)
    worker = _take(key) if reuse else None
    if worker is not None:
        reply = _exchange_or_stop(worker, request, backstop_s)
        if reply is not None and not reply.stale:
            return _finish(worker, reply, reuse)
        # It was gone before it started anything for this request (nothing of this evaluation
        # ran), or it answered another request (one a candidate of an earlier evaluation slipped
        # into its input): a fresh worker takes the request.
        stop(worker)
    worker = _start(key, env, None if reuse else memory_bytes)
    reply = _exchange_or_stop(worker, request, backstop_s)
    if reply is None:
        reply = _lost(worker, request, backstop_s, timed_out=False)
    return _finish(worker, reply, reuse)


def prestart(harness: str, device: str, env: dict[str, str]) -> int | None:
    """Start an idle worker for this environment and device now, unless one is idle already, so
    that its imports overlap the caller's own work. Its pid; None with reuse off."""
    if not reuse_enabled():
        return None
    key = _key(harness, device, env)
    with _lock:
        idle = [w for w in _idle if w.key == key]
    if idle:
        return idle[-1].proc.pid
    worker = _start(key, env, None)
    _finish(worker, Reply({}, None, worker.proc.pid, False), reuse=True)
    return worker.proc.pid


def shutdown_workers() -> None:
    """Stop every worker this process started (also run at interpreter exit). Idle workers hold
    nothing worth a wait: each is killed with its process group at once."""
    with _lock:
        workers = list(_alive) if os.getpid() == _owner_pid else []
        _idle.clear()
    for worker in workers:
        stop(worker)


def stop(worker: Worker) -> None:
    """Kill the worker's process group and every child group it reported, and reap it."""
    if worker.stopped:
        return
    worker.stopped = True
    kill_group(worker.proc.pid)
    for pgid in worker.groups:
        kill_group(pgid)
    with contextlib.suppress(OSError, ValueError):
        worker.proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(10)
    with contextlib.suppress(OSError):
        os.close(worker.results_fd)
    worker.results_fd = -1
    with contextlib.suppress(OSError):
        worker.home.cleanup()
    with _lock:
        _alive.discard(worker)


def _key(harness: str, device: str, env: dict[str, str]) -> WorkerKey:
    relevant = tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV))
    return WorkerKey(sys.executable, harness, device, relevant)


def _take(key: WorkerKey) -> Worker | None:
    with _lock:
        if os.getpid() != _owner_pid:
            return None
        for worker in reversed(_idle):  # the one used last
            if worker.key == key:
                _idle.remove(worker)
                break
        else:
            return None
    if worker.proc.poll() is not None:
        stop(worker)
        return None
    return worker


def _finish(worker: Worker, reply: Reply, reuse: bool) -> Reply:
    healthy = (
        reuse
        and reply.failure is None
        and not reply.result.get("stdin_injected")
        and worker.proc.poll() is None
        and not worker.groups
    )
    if not healthy:
        stop(worker)
        return reply
    with _lock:
        _idle.append(worker)
        surplus = _idle[:-MAX_IDLE]
        del _idle[:-MAX_IDLE]
    for old in surplus:
        stop(old)
    return reply


def _start(key: WorkerKey, env: dict[str, str], memory_bytes: int | None) -> Worker:
    read_fd, write_fd = os.pipe()
    home = tempfile.TemporaryDirectory(prefix="autotune-worker-")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "loop.worker_serve", str(write_fd), key.device],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd,),
            env=env,
            cwd=home.name,
            start_new_session=not memory_bytes,
            preexec_fn=_limit_memory(memory_bytes) if memory_bytes else None,
        )
    except BaseException:
        os.close(read_fd)
        home.cleanup()
        raise
    finally:
        os.close(write_fd)
    worker = Worker(key, proc, read_fd, _StderrTail(proc.stderr), home)
    with _lock:
        _alive.add(worker)
    return worker


def _limit_memory(nbytes: int):
    def apply() -> None:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))

    return apply


def _exchange_or_stop(worker: Worker, request: dict, backstop_s: float) -> Reply | None:
    """`_exchange`, with the worker stopped should this thread be interrupted meanwhile (Ctrl-C):
    a worker left in the middle of a request must never serve another."""
    try:
        return _exchange(worker, request, backstop_s)
    except BaseException:
        stop(worker)
        raise


def _exchange(worker: Worker, request: dict, backstop_s: float) -> Reply | None:
    """The worker's reply to `request`; None when the worker was gone before it started any
    child for it (so nothing of the request ran)."""
    worker.stderr.clear()
    reused = worker.served > 0
    worker.served += 1
    pid = worker.proc.pid
    try:
        line = json.dumps({**request, "sent_at": time.monotonic()}) + "\n"
        worker.proc.stdin.write(line.encode())
        worker.proc.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        return None
    deadline = time.monotonic() + backstop_s
    started_any = False
    while True:
        line, timed_out = _next_line(worker, deadline)
        if line is None:
            if timed_out or started_any:
                return _lost(worker, request, backstop_s, timed_out)
            return None
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            msg = None
        if not isinstance(msg, dict):
            why = reason("crash", "the worker wrote something that is not a JSON object")
            return Reply({}, why, pid, reused)
        if "group" in msg:
            started_any = True
            pgid = msg["group"]
            if not msg.get("live"):
                worker.groups.discard(pgid)
            elif _is_child_group(pgid, pid):  # never kill a group the worker merely named
                worker.groups.add(pgid)
            continue
        if msg.get("nonce") != request["nonce"]:
            why = reason("crash", "the worker's result did not carry this evaluation's nonce")
            return Reply({}, why, pid, reused, stale=True)
        if "error" in msg:
            why = reason("crash", f"harness error in the worker: {msg['error']}")
            return Reply({}, why, pid, reused)
        return Reply(msg, None, pid, reused)


def _is_child_group(pgid: object, worker_pid: int) -> bool:
    """Whether `pgid` is a process group the worker may have started: an integer above 1, not
    this process's own group, led (where /proc tells) by a child of the worker."""
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
        return False
    if pgid in (os.getpid(), os.getpgrp()):
        return False
    try:
        stat = Path(f"/proc/{pgid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()  # no /proc: trust the bounds above
    fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": state, ppid, pgrp, ...
    return len(fields) > 2 and int(fields[1]) == worker_pid and int(fields[2]) == pgid


def _next_line(worker: Worker, deadline: float) -> tuple[bytes | None, bool]:
    """(the next line on the worker's result pipe, False); (None, True) past the deadline;
    (None, False) when the pipe closed (the worker is gone)."""
    while b"\n" not in worker.pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, True
        ready, _, _ = select.select([worker.results_fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(worker.results_fd, 1 << 20)
        if not chunk:
            return None, False
        worker.pending += chunk
    line, _, worker.pending = worker.pending.partition(b"\n")
    return line, False


def _lost(worker: Worker, request: dict, backstop_s: float, timed_out: bool) -> Reply:
    """The worker gave no answer: it hung past the backstop, or died."""
    stop(worker)
    returncode = worker.proc.returncode
    tail = worker.stderr.text(wait_s=2.0)[-800:].strip()
    reused = worker.served > 1
    pid = worker.proc.pid
    if timed_out:
        return Reply({}, reason("timeout", f"the worker ran past {backstop_s:.0f} s"), pid, reused)
    if "MemoryError" in tail or "out of memory" in tail.lower() or returncode == -9:
        return Reply(
            {},
            reason("out-of-memory", f"worker exited {returncode}: {tail[-300:]}"),
            pid,
            reused,
        )
    return Reply(
        {},
        reason("crash", f"worker exited {returncode} without a result: {tail[-300:]}"),
        pid,
        reused,
    )


def _forget_inherited() -> None:
    """In a forked copy of this process the workers belong to the original: never use them."""
    global _owner_pid, _lock
    _lock = threading.Lock()
    _idle.clear()
    _alive.clear()
    _owner_pid = os.getpid()


os.register_at_fork(after_in_child=_forget_inherited)
atexit.register(shutdown_workers)


def harness_env(harness_root: Path) -> dict[str, str]:
    """The worker's environment: this process's without secrets, the harness first on the path,
    and torch kept from initialising CUDA in the worker (it forks children that use the GPU)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_SECRET")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(harness_root), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    return env


def prestart_worker(device: str) -> int | None:
    """`prestart` for the harness of this copy (the package this module belongs to): a command
    line calls it first thing, so the worker's imports overlap the command's own."""
    root = Path(__file__).resolve().parent.parent
    return prestart(str(root), device, harness_env(root))

"""The worker process: `python -P -m loop.worker_serve FD DEVICE`.

It imports torch (and Triton where installed) and the harness once, then serves evaluation
requests one after another: one JSON request per line on stdin, for each one JSON line on file
descriptor FD carrying the request's nonce (before it, a line per child process group started
or ended, so the evaluator can kill them should this process die). It ends at the end of stdin,
after a harness error, or when CUDA got initialised in it (it forks children that use the GPU,
so it must never touch the GPU itself).

Nothing a request did may reach the next one: the children are forked and gone, each request
loads its task module afresh (task and candidate modules leave sys.modules) and runs in its own
working directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback

STARTED_AT = time.monotonic()
TRITON_ON_CPU = "TRITON_INTERPRET"
TASK_MODULE_PREFIX = "autotune_task_"  # loop.tasks.load_task's module names


def main() -> int:
    result_fd, device = int(sys.argv[1]), sys.argv[2]
    sys.stdout = sys.stderr  # whatever a candidate prints can never pass for a result
    if device == "cpu":
        os.environ[TRITON_ON_CPU] = "1"  # before Triton loads
    from loop.worker_child import Channel

    out = Channel(result_fd)
    broken = _import_harness()
    requests = _Requests(sys.stdin.fileno())
    while True:
        line = requests.readline()
        if not line:
            return 0
        received = time.monotonic()
        nonce = None
        try:
            request = json.loads(line)
            nonce = request.get("nonce")
            if broken:
                raise broken
            # The request waited for the harness from when it was sent (the monotonic clock is
            # the host's) or from when this process started, whichever is later.
            since = max(float(request.get("sent_at", received)), STARTED_AT)
            result = _serve_one(request, device, since, out)
        except BaseException as exc:  # the harness itself failed: say so, never hang the parent
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        result["nonce"] = nonce
        # The evaluator sends the next request only after this answer, so anything waiting on
        # stdin now was written by something this request ran: drop it, and serve no more.
        injected = requests.drain()
        if injected:
            result["stdin_injected"] = True
        out.send(result)
        if "error" in result or injected or _cuda_initialised():
            return 1  # refuse further requests: the evaluator starts a fresh worker


def _import_harness() -> BaseException | None:
    """Import once what every request needs; a failure is reported on the first request."""
    try:
        import torch  # noqa: F401

        if importlib.util.find_spec("triton") is not None:
            import triton  # noqa: F401

        from baselines import roofline, timer  # noqa: F401
        from loop import reasons, tasks, worker  # noqa: F401
    except BaseException as exc:
        return exc
    return None


def _serve_one(request: dict, device: str, since: float, out) -> dict:
    from loop.worker import CANDIDATE_MODULE_PREFIX, supervise
    from loop.worker_child import ChildSettings

    if request.get("device") != device:
        raise ValueError(f"this worker serves device {device}, not {request.get('device')}")
    if _cuda_initialised():
        raise RuntimeError("CUDA was initialised in the worker; it must never touch the GPU")
    _forget_modules((TASK_MODULE_PREFIX, CANDIDATE_MODULE_PREFIX))
    if request.get("cwd"):
        os.chdir(request["cwd"])
    memory = request.get("cpu_memory_bytes") if device == "cpu" else None
    children = ChildSettings(
        memory_bytes=memory,
        private_fds=(out.fd,),
        on_group=lambda pgid, live: out.send({"group": pgid, "live": live}),
    )
    return supervise(request, since, children)


def _forget_modules(prefixes: tuple[str, ...]) -> None:
    """Drop the previous request's task (and any candidate) modules, so this one loads its own;
    with them goes the wrappers loop.tasks compiled around their `eager`."""
    from loop import tasks

    for name in [n for n in sys.modules if n.startswith(prefixes)]:
        del sys.modules[name]
    tasks._COMPILED.clear()


class _Requests:
    """Lines from stdin, read without Python's buffering, so that what is left over after a
    request is known exactly."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                line, self.buf = self.buf, b""
                return line
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"

    def drain(self) -> bool:
        """Discard whatever is waiting; whether there was anything."""
        found, self.buf = bool(self.buf), b""
        os.set_blocking(self.fd, False)
        try:
            while True:
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                found = True
        finally:
            os.set_blocking(self.fd, True)
        return found


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


if __name__ == "__main__":
    sys.exit(main())

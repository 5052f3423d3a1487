"""One process per GPU on one host: start ranks, give each a clean environment, collect results.

`launch("module:function", world_size, kwargs, backend=...)` starts `world_size` fresh Python
processes (`python -m baselines.multiprocess`), each joins one torch.distributed process group
(rendezvous through a file, so no port can clash) and calls `function(ctx, **kwargs)` with a
`RankContext`; the return values come back in rank order. A rank that fails, or a run past its
time limit, stops every rank (each by its own process id) and raises `LaunchError` naming the
rank and the tail of its log.

Environment hygiene: every rank gets the parent's environment plus `SAFE_ENV` forced on top
(NVLink multicast off in NCCL, PyTorch symmetric memory and NVSHMEM), so the rank and whatever
it starts in turn keep multicast off even where the parent's environment lacked the variables.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Multicast over NVLink can take a shared host's GPUs out of service: always off in every rank.
SAFE_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
BACKENDS = ("nccl", "gloo")
REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL = 2000


class LaunchError(Exception):
    """A rank that failed or did not finish; the message names the rank and why."""


@dataclass(frozen=True)
class RankContext:
    """What a rank function gets: its rank, the world, its device and the process group."""

    rank: int
    world_size: int
    backend: str
    device: str  # "cuda:N" (one GPU per rank) or "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def child_env(rank: int, world_size: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of rank `rank`: `base` (the parent's by default), the torchrun-style rank
    variables, one OpenMP thread unless set, the repository on PYTHONPATH, and SAFE_ENV forced."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    env.update(SAFE_ENV)
    return env


def _check(target: str, world_size: int, backend: str) -> None:
    module, sep, function = target.partition(":")
    if not sep or not module or not function:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < world_size:
            raise ValueError(
                f"world_size {world_size} needs {world_size} GPUs for nccl, found {found}"
            )


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop the ranks still running: each rank's own process group, by its pid."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return ""


def launch(
    target: str,
    world_size: int,
    kwargs: dict[str, Any] | None = None,
    *,
    backend: str = "nccl",
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run `target(ctx, **kwargs)` in `world_size` ranks; their return values in rank order.

    Raises ValueError for bad arguments (naming the field) and LaunchError when a rank fails or
    the run passes `timeout_s`."""
    _check(target, world_size, backend)
    with tempfile.TemporaryDirectory(prefix="autotune-ranks-") as tmp:
        work = Path(tmp)
        job = {"target": target, "kwargs": kwargs or {}, "backend": backend, "world": world_size}
        (work / "job.pkl").write_bytes(pickle.dumps(job))
        procs = []
        try:
            for rank in range(world_size):
                with open(work / f"rank{rank}.log", "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "baselines.multiprocess", str(work), str(rank)],
                            env=child_env(rank, world_size, env),
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            cwd=REPO_ROOT,
                            start_new_session=True,
                        )
                    )
            _wait(procs, work, timeout_s)
        finally:
            _stop(procs)
        return [_result(work, rank) for rank in range(world_size)]


def _wait(procs: list[subprocess.Popen], work: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank = failed[0]
            raise LaunchError(
                f"rank {rank} exited {codes[rank]}: {_error(work, rank)}"
                f"\n--- rank {rank} log ---\n{_tail(work / f'rank{rank}.log')}"
            )
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            waiting = [r for r, c in enumerate(codes) if c is None]
            raise LaunchError(
                f"ranks {waiting} did not finish within {timeout_s:g} s (a rank waiting on a "
                f"peer that failed or hung)\n--- rank {waiting[0]} log ---\n"
                f"{_tail(work / f'rank{waiting[0]}.log')}"
            )
        time.sleep(0.05)


def _error(work: Path, rank: int) -> str:
    path = work / f"rank{rank}.pkl"
    if not path.exists():
        return "no result written"
    doc = pickle.loads(path.read_bytes())
    return doc.get("error") or "no error recorded"


def _result(work: Path, rank: int) -> Any:
    path = work / f"rank{rank}.pkl"
    if not path.exists():
        raise LaunchError(f"rank {rank} wrote no result:\n{_tail(work / f'rank{rank}.log')}")
    doc = pickle.loads(path.read_bytes())
    if not doc["ok"]:
        raise LaunchError(f"rank {rank} failed: {doc['error']}")
    return doc["value"]


def _rank_main(work: Path, rank: int) -> int:
    import torch
    import torch.distributed as dist

    job = pickle.loads((work / "job.pkl").read_bytes())
    world, backend = job["world"], job["backend"]
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    out: dict[str, Any]
    try:
        module_name, _, function_name = job["target"].partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        init = {"backend": backend, "init_method": f"file://{work / 'rendezvous'}"}
        if backend == "nccl":
            init["device_id"] = torch.device(device)
        dist.init_process_group(rank=rank, world_size=world, **init)
        ctx = RankContext(rank=rank, world_size=world, backend=backend, device=device)
        out = {"ok": True, "value": function(ctx, **job["kwargs"])}
    except BaseException as exc:  # reported to the parent, which stops every rank
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    (work / f"rank{rank}.pkl").write_bytes(pickle.dumps(out))
    if out["ok"] and dist.is_initialized():
        dist.destroy_process_group()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(_rank_main(Path(sys.argv[1]), int(sys.argv[2])))

"""Distributed tasks (kernels/allreduce): verify and time candidates on every rank of one host,
one process per GPU, and build the dispatch table that hands sizes back to NCCL where it wins.

`run_distributed_task(task, world_size, device=...)` checks each candidate's source
(`loop.guards`), starts the ranks through `baselines.multiprocess.launch` (which keeps NVLink
multicast off in every rank and its children), and per shape, on every rank: sets the candidate
up (collective, outside capture), verifies it on fresh inputs from a secret seed against the
float64 sum every rank rebuilds from the seed (inputs checked unmodified, the last output
poisoned before the next call), times it (CUDA-graph replays of several calls on GPUs, the host
clock on the CPU; the same fixed number of blocks on every rank), and verifies it again. A
block's time is the slowest rank's. The baseline is the task's first `DIST_PEERS` entry (NCCL).
"""

from __future__ import annotations

import importlib.util
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from baselines.multiprocess import RankContext, launch
from baselines.p2p import combine_ranks, fixed_rule
from baselines.stats import ratio_interval, summarize
from baselines.timer import CaptureError, GpuTimer, cpu_block, run_interleaved
from loop.dispatch import build_dispatch
from loop.guards import check_source
from loop.tasks import Task, load_task

MIN_SPEEDUP = 1.0  # a candidate takes a size only when its whole interval clears this


@dataclass(frozen=True)
class Comm:
    """What a candidate's `setup` gets."""

    rank: int
    world_size: int
    device: str
    backend: str
    group: Any  # torch.distributed ProcessGroup


@dataclass
class Entry:
    """One candidate (or peer) on one shape, combined over ranks."""

    shape: str
    name: str
    ok: bool
    reason: str = ""
    max_error: float = 0.0
    time_us: float | None = None
    ci_us: tuple[float, float] | None = None
    speedup: float | None = None  # baseline time / this time
    speedup_ci: tuple[float, float] | None = None


@dataclass
class DistributedResult:
    task: str
    world_size: int
    device: str
    backend: str
    entries: list[Entry]
    dispatch: dict
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "world_size": self.world_size,
            "device": self.device,
            "backend": self.backend,
            "entries": [asdict(e) for e in self.entries],
            "dispatch": self.dispatch,
            "notes": list(self.notes),
        }


def load_candidate(path: Path, forbidden_ops: tuple[str, ...] = ()) -> ModuleType:
    """Load a candidate file after its static check; ValueError names what the check found."""
    report = check_source(path.read_text(), str(path), forbidden_ops)
    if report.reasons:
        found = "; ".join(f"{r.code}: {r.message}" for r in report.reasons)
        raise ValueError(f"{path.name}: rejected by the static checks: {found}")
    spec = importlib.util.spec_from_file_location(f"autotune_dist_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = torch.linalg.vector_norm(out.to(torch.float64) - ref)
    return float(diff / torch.linalg.vector_norm(ref).clamp_min(1e-30))


def _agree(ok: bool, cpu_group) -> bool:
    """Every rank's flag, and-ed: a rank that failed stops all before the next collective."""
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
    return bool(flag.item())


def _check_once(task: Task, dims: dict, seed: int, ctx: RankContext, call) -> tuple[float, str]:
    x = task.module.make_rank_input(dims, seed, ctx.rank, ctx.device)
    before = x.clone()
    out = call(x)
    ref = task.module.expected(dims, seed, ctx.world_size, ctx.device)
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != x.dtype:
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out)
        return float("inf"), f"output {got}, expected {tuple(ref.shape)} {x.dtype}"
    if not torch.equal(x, before):
        return float("inf"), "modified its input"
    error = _relative_error(out, ref)
    tolerance = task.tolerance(dims["dtype"])
    poisoned = out.float().fill_(float("nan")).to(out.dtype)
    out.copy_(poisoned)  # a stale buffer returned next time reads as NaN
    if not error <= tolerance:
        return error, f"relative error {error:.3g} above {tolerance:g}"
    return error, ""


def _time(ctx: RankContext, call, x: torch.Tensor, blocks: int, ops: int) -> list[float]:
    rule = fixed_rule(blocks, 5)

    def burst() -> None:
        for _ in range(ops):
            call(x)

    if ctx.is_cuda:
        timer = GpuTimer(ctx.device)
        graph, _ = timer.capture(burst)
        medians = run_interleaved([lambda n: timer.block(graph, n)], rule)[0]
    else:
        medians = run_interleaved([lambda n: cpu_block(burst, n)], rule)[0]
    return [m / ops for m in medians]


def rank_main(
    ctx: RankContext,
    task_folder: str,
    candidates: list[str],
    shapes: list[str] | None,
    seeds: list[int],
    blocks: int,
    params: dict[str, dict],
) -> dict[str, dict[str, dict]]:
    """Rank function: {shape: {name: {"ok", "reason", "error", "times"}}} for this rank."""
    import torch.distributed as dist

    task = load_task(task_folder)
    cpu_group = dist.new_group(backend="gloo")
    comm = Comm(ctx.rank, ctx.world_size, ctx.device, ctx.backend, dist.group.WORLD)
    runnables: dict[str, tuple] = dict(task.module.DIST_PEERS)
    forbidden = tuple(getattr(task.module, "FORBIDDEN_OPS", ()))
    for path in candidates:
        module = load_candidate(Path(path), forbidden)
        runnables[Path(path).name] = (getattr(module, "setup", None), module.kernel)
    wanted = [s for s in task.shapes(ctx.device) if shapes is None or s.name in shapes]
    out: dict[str, dict[str, dict]] = {}
    for shape in wanted:
        dims = shape.to_dict()
        dtype = getattr(torch, dims["dtype"])
        out[shape.name] = {}
        for name, (setup, kernel) in runnables.items():
            kw = dict(params.get(name, {}))
            record: dict[str, Any] = {"ok": False, "reason": "", "error": 0.0, "times": None}
            try:
                state = setup(comm, dims["numel"], dtype, **kw) if setup else None
                ok = True
            except Exception as exc:  # reported per candidate; the others still run
                record["reason"], ok = f"setup failed: {type(exc).__name__}: {exc}", False
            if not _agree(ok, cpu_group):
                record["reason"] = record["reason"] or "setup failed on another rank"
                out[shape.name][name] = record
                continue

            def call(x, state=state, kernel=kernel, kw=kw):
                return kernel(x, state, **kw)

            try:
                record.update(_verify_and_time(task, dims, ctx, call, seeds, blocks, cpu_group))
            except (CaptureError, RuntimeError, ValueError) as exc:
                record["reason"] = f"{type(exc).__name__}: {exc}"
            out[shape.name][name] = record
            if ctx.is_cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    return out


def _verify_and_time(task, dims, ctx, call, seeds, blocks, cpu_group) -> dict:
    worst, reason = 0.0, ""
    for seed in seeds[:-1]:
        error, reason = _check_once(task, dims, seed, ctx, call)
        worst = max(worst, error)
        if reason:
            break
    if not _agree(not reason, cpu_group):
        return {"ok": False, "reason": reason or "wrong on another rank", "error": worst}
    x = task.module.make_rank_input(dims, seeds[0], ctx.rank, ctx.device)
    ops = 20 if dims["bytes"] <= 1 << 20 else 5 if dims["bytes"] <= 16 << 20 else 1
    times = _time(ctx, call, x, blocks, ops if ctx.is_cuda else 1)
    error, reason = _check_once(task, dims, seeds[-1], ctx, call)  # after timing, fresh inputs
    ok = _agree(not reason, cpu_group)
    reason = reason or ("" if ok else "wrong on another rank after timing")
    return {"ok": ok, "reason": reason, "error": max(worst, error), "times": times}


def _combine(task: Task, per_rank: list[dict], baseline: str) -> list[Entry]:
    entries = []
    for shape in per_rank[0]:
        base_times = None
        if all(r[shape][baseline]["ok"] for r in per_rank):
            base_times = combine_ranks([r[shape][baseline]["times"] for r in per_rank])
        for name in per_rank[0][shape]:
            records = [r[shape][name] for r in per_rank]
            ok = all(rec["ok"] for rec in records)
            reason = next((rec["reason"] for rec in records if rec["reason"]), "")
            entry = Entry(shape, name, ok, reason, max(rec["error"] for rec in records))
            if ok:
                times = combine_ranks([rec["times"] for rec in records])
                s = summarize([t * 1e6 for t in times])
                entry.time_us, entry.ci_us = s.median, (s.ci_low, s.ci_high)
                if base_times is not None:
                    ratio = ratio_interval(base_times, times)
                    entry.speedup, entry.speedup_ci = ratio.ratio, (ratio.ci_low, ratio.ci_high)
            entries.append(entry)
    return entries


def dispatch_table(task: Task, device: str, entries: list[Entry], baseline: str) -> dict:
    """Per shape the fastest candidate whose speedup interval clears MIN_SPEEDUP, else the
    baseline; plus a baseline row past the largest size measured, per dtype (large messages go
    back to NCCL)."""
    rows = []
    shapes = {s.name: s.to_dict() for s in task.shapes(device)}
    largest: dict[str, int] = {}
    for name, dims in shapes.items():
        mine = [e for e in entries if e.shape == name]
        if not mine:
            continue
        winners = [
            e
            for e in mine
            if e.ok and e.name != baseline and e.speedup_ci and e.speedup_ci[0] > MIN_SPEEDUP
        ]
        best = max(winners, key=lambda e: e.speedup or 0.0, default=None)
        keep = {"bytes": dims["bytes"], "dtype": dims["dtype"]}
        rows.append(
            {
                "shape": name,
                "dims": keep,
                "source": "candidate" if best else "peer",
                "name": best.name if best else baseline,
                "params": {},
                "speedup": best.speedup if best else 1.0,
            }
        )
        largest[dims["dtype"]] = max(largest.get(dims["dtype"], 0), dims["bytes"])
    for dtype, nbytes in largest.items():
        rows.append(
            {
                "shape": f"{dtype}-above-{nbytes}",
                "dims": {"bytes": nbytes * 2, "dtype": dtype},
                "source": "peer",
                "name": baseline,
                "params": {},
                "speedup": 1.0,
            }
        )
    return build_dispatch(task.name, "bytes", rows)


def run_distributed_task(
    task_name: str = "allreduce",
    world_size: int | None = None,
    *,
    device: str | None = None,
    candidates: list[str] | None = None,
    shapes: list[str] | None = None,
    params: dict[str, dict] | None = None,
    seeds: int = 3,
    blocks: int = 10,
    timeout_s: float = 600.0,
) -> DistributedResult:
    """Verify and time a distributed task's candidates on `world_size` ranks ("cuda": NCCL, one
    GPU per rank, all GPUs by default; "cpu": gloo, 2 ranks by default)."""
    task = load_task(task_name)
    if not task.distributed:
        raise ValueError(f"task {task.name!r} is not a distributed task (no DISTRIBUTED = True)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    backend = "nccl" if device == "cuda" else "gloo"
    if world_size is None:
        world_size = torch.cuda.device_count() if device == "cuda" else 2
    if seeds < 2:
        raise ValueError(f"seeds must be at least 2 (one before timing, one after), got {seeds}")
    key = "cuda" if device == "cuda" else "cpu"
    names = candidates if candidates is not None else task.module.DIST_CANDIDATES[key]
    paths = [str(task.folder / n) if not Path(n).is_file() else str(Path(n)) for n in names]
    for p in paths:
        if not Path(p).is_file():
            raise ValueError(f"candidates: no file {p}")
    known = {s.name for s in task.shapes(device)}
    bad = [s for s in shapes or [] if s not in known]
    if bad:
        raise ValueError(f"shapes: {bad} not among {sorted(known)}")
    seed_list = [secrets.randbelow(2**31) for _ in range(seeds)]
    per_rank = launch(
        "loop.distributed:rank_main",
        world_size,
        {
            "task_folder": str(task.folder),
            "candidates": paths,
            "shapes": shapes,
            "seeds": seed_list,
            "blocks": blocks,
            "params": params or {},
        },
        backend=backend,
        timeout_s=timeout_s,
    )
    baseline = next(iter(task.module.DIST_PEERS))
    entries = _combine(task, per_rank, baseline)
    return DistributedResult(
        task=task.name,
        world_size=world_size,
        device=device,
        backend=backend,
        entries=entries,
        dispatch=dispatch_table(task, device, entries, baseline),
    )

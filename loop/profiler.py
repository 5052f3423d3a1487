"""Nsight Compute counters for the brief: find `ncu`, run it on one call of a candidate at one
shape, and parse its CSV into `KernelCounters` per profiled kernel.

The profiled process (`python -m loop.profiler drive ...`) loads the candidate directly, without
the evaluator's worker, guards or secret seeds: it is only for the brief's hints, never for a
verdict, and must never be used for one. Nothing here raises for a missing or failing profiler:
`profile_candidate` says why in `ProfileResult.reason`.
"""

from __future__ import annotations

import argparse
import csv
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loop.tasks import Task

NCU_FALLBACKS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")
SECTIONS = ("SpeedOfLight", "Occupancy", "MemoryWorkloadAnalysis")
HEADER_COLUMNS = ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
MAX_KERNELS = 32  # kernels profiled per candidate call (ncu replays each one several times)
WARMUP_CALLS = 2  # unprofiled calls first, so JIT compilation and autotuning stay out
HARNESS_ROOT = Path(__file__).resolve().parent.parent

# Metric name -> field, for the metrics whose unit needs no conversion.
_PLAIN = {
    "DRAM Throughput": "dram_throughput_pct",
    "Compute (SM) Throughput": "compute_sm_throughput_pct",
    "L2 Hit Rate": "l2_hit_rate_pct",
    "L1/TEX Hit Rate": "l1_hit_rate_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Block Limit Registers": "block_limit_registers",
    "Local Memory Spilling Requests": "local_spill_requests",
}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}
_TIME_NS |= {"s": 1e9, "second": 1e9}
_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(r"^([kmgt]?)(?:byte|b)/s(?:econd)?$", re.IGNORECASE)


@dataclass
class KernelCounters:
    """The key counters of one profiled kernel launch (None where ncu gave no value)."""

    name: str
    block_size: tuple[int, ...] | None = None
    grid_size: tuple[int, ...] | None = None
    duration_ns: float | None = None
    dram_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    memory_throughput_bytes_s: float | None = None
    compute_sm_throughput_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    l1_hit_rate_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    block_limit_registers: float | None = None
    local_spill_requests: float | None = None
    # The occupancy limiter ("registers", "shared mem", "warps", ...): the smallest block limit.
    occupancy_limiter: str | None = None
    # Every metric as "Section/Metric Name" -> value in ncu's unit, for anything not above.
    metrics: dict[str, float | None] = field(default_factory=dict)


@dataclass
class ProfileResult:
    """Counters for one shape of one candidate, or why there are none."""

    shape: str
    available: bool
    reason: str = ""
    kernels: list[KernelCounters] = field(default_factory=list)


def find_ncu() -> Path | None:
    """`ncu` on PATH, else in the usual CUDA toolkit and Nsight Compute install folders."""
    found = shutil.which("ncu")
    if found:
        return Path(found)
    for pattern in NCU_FALLBACKS:
        for path in sorted(glob.glob(pattern), reverse=True):  # newest version first
            if os.access(path, os.X_OK):
                return Path(path)
    return None


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("no data", "n/a", "nan", "-"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _dims(text: str) -> tuple[int, ...] | None:
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts) or None


def _header(rows: list[list[str]]) -> int:
    for i, row in enumerate(rows):
        if row and row[0] == "ID" and "Metric Name" in row:
            missing = [c for c in HEADER_COLUMNS if c not in row]
            if missing:
                raise ValueError(f"ncu CSV header lacks the column(s) {', '.join(missing)}")
            return i
    raise ValueError(
        "ncu CSV: no header row with the columns " + ", ".join(HEADER_COLUMNS) + " found "
        "(was ncu run with --csv and did it profile any kernel?)"
    )


def _set_metric(k: KernelCounters, name: str, unit: str, value: float | None) -> None:
    unit_l = unit.strip().lower()
    if name == "Duration":
        scale = _TIME_NS.get(unit_l)
        k.duration_ns = value * scale if value is not None and scale else None
    elif name == "Memory Throughput":
        rate = _RATE.match(unit_l)
        if unit_l == "%":
            k.memory_throughput_pct = value
        elif rate and value is not None:
            k.memory_throughput_bytes_s = value * _SI[rate.group(1)]
    elif name in _PLAIN:
        setattr(k, _PLAIN[name], value)


def _limiter(k: KernelCounters) -> str | None:
    limits = {
        name.split("/", 1)[1].removeprefix("Block Limit ").lower(): value
        for name, value in k.metrics.items()
        if "/Block Limit " in name and value is not None
    }
    return min(limits, key=lambda n: limits[n]) if limits else None


def parse_ncu_csv(text: str) -> list[KernelCounters]:
    """One `KernelCounters` per profiled kernel, in profiling order, from `ncu --csv` output
    (a details page: one row per metric). Lines before the header (==PROF== lines, the
    program's own output) and rows that are not metrics (rule results) are skipped."""
    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    start = _header(rows)
    header = rows[start]
    col = {name: header.index(name) for name in header}
    by_id: dict[tuple[str, str], KernelCounters] = {}
    for row in rows[start + 1 :]:
        if len(row) <= col["Metric Value"] or row[0].startswith("=="):
            continue
        metric = row[col["Metric Name"]].strip()
        if not metric:
            continue
        pid = row[col["Process ID"]] if "Process ID" in col else ""
        key = (pid, row[col["ID"]])
        if key not in by_id:
            by_id[key] = KernelCounters(
                name=row[col["Kernel Name"]],
                block_size=_dims(row[col["Block Size"]]) if "Block Size" in col else None,
                grid_size=_dims(row[col["Grid Size"]]) if "Grid Size" in col else None,
            )
        k = by_id[key]
        value = _number(row[col["Metric Value"]])
        section = row[col["Section Name"]] if "Section Name" in col else ""
        k.metrics[f"{section}/{metric}"] = value
        _set_metric(k, metric, row[col["Metric Unit"]], value)
    for k in by_id.values():
        k.occupancy_limiter = _limiter(k)
    return list(by_id.values())


def ncu_command(ncu: Path, driver: list[str]) -> list[str]:
    """ncu over `driver`, counting only kernels between cudaProfilerStart and Stop. ncu locks
    the GPU's clocks to base while it profiles unless told not to: the GPU is shared and its
    clocks are never ours to change, so the counters come at whatever clocks it runs."""
    sections = [arg for s in SECTIONS for arg in ("--section", s)]
    return [
        str(ncu),
        "--clock-control",
        "none",
        "--csv",
        "--print-units",
        "base",
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--launch-count",
        str(MAX_KERNELS),
        *sections,
        *driver,
    ]


def failure_reason(returncode: int, stdout: str, stderr: str) -> str:
    """One line on why ncu gave no counters: its last ==ERROR== line (for example
    "LibraryNotLoaded" on gVisor hosts, ERR_NVGPUCTRPERM without counter permission), else the
    last line of stderr, else the exit status."""
    lines = [line.strip() for line in (stdout + "\n" + stderr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("==ERROR==")]
    if errors:
        return f"ncu failed: {errors[-1]}"
    tail = [line.strip() for line in stderr.splitlines() if line.strip()]
    if tail:
        return f"ncu failed (exit {returncode}): {tail[-1]}"
    return f"ncu failed (exit {returncode}) without a message"


def driver_command(
    task_folder: Path | str, candidate_path: Path | str, params: dict, shape_name: str, device: str
) -> list[str]:
    """The profiled process's command line (this module's `drive`), with this interpreter."""
    return [
        sys.executable,
        "-P",
        "-m",
        "loop.profiler",
        "drive",
        "--task",
        str(Path(task_folder).resolve()),
        "--candidate",
        str(Path(candidate_path).resolve()),
        "--params",
        json.dumps(params),
        "--shape",
        shape_name,
        "--device",
        device,
    ]


def driver_env() -> dict[str, str]:
    """The environment without the evaluator's secrets, this copy of `loop` first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_SECRET")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HARNESS_ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    return env


def profile_candidate(
    task_folder: Path | str,
    candidate_path: Path | str,
    params: dict,
    shape_name: str,
    device_index: int = 0,
    timeout_s: float = 120.0,
    device: str = "cuda",
) -> ProfileResult:
    """Run ncu over a few calls of the candidate's `kernel` at `shape_name` on GPU
    `device_index` and parse the counters of the last call. Never raises for a missing or
    failing profiler: the result then has `available=False` and a one-line reason."""

    def none(reason: str) -> ProfileResult:
        return ProfileResult(shape=shape_name, available=False, reason=reason)

    if not device.startswith("cuda"):
        return none(f"device is {device}, not cuda")
    ncu = find_ncu()
    if ncu is None:
        return none("no ncu (Nsight Compute) on PATH or in /usr/local/cuda/bin")
    driver = driver_command(task_folder, candidate_path, params, shape_name, f"cuda:{device_index}")
    env = driver_env()
    with tempfile.TemporaryDirectory(prefix="autotune-ncu-") as cwd:
        try:
            proc = subprocess.Popen(
                ncu_command(ncu, driver),
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # a timeout ends ncu and the profiled process together
            )
        except OSError as exc:
            return none(f"ncu could not start: {exc}")
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return none(f"ncu timed out after {timeout_s:g} s")
    if proc.returncode != 0:
        return none(failure_reason(proc.returncode, stdout, stderr))
    try:
        kernels = parse_ncu_csv(stdout)
    except ValueError as exc:
        return none(f"{failure_reason(proc.returncode, stdout, stderr)}; {exc}")
    if not kernels:
        return none("ncu profiled no kernel in the candidate's call")
    return ProfileResult(shape=shape_name, available=True, kernels=kernels)


def largest_shape(task: Task, device: str, shapes: list[str] | None = None) -> str:
    """The shape with the most bytes moved (then FLOPs): where counters say the most."""
    pool = [s for s in task.shapes(device) if not shapes or s.name in shapes]
    return max(pool, key=lambda s: (task.bytes_moved(s), task.flops(s))).name


def profile_largest_shape(
    task: Task,
    candidate_path: Path | str,
    params: dict,
    device: str,
    shapes: list[str] | None = None,
) -> dict[str, ProfileResult]:
    """`{shape: ProfileResult}` for the task's largest shape: what `BriefInput.profiles` takes."""
    name = largest_shape(task, device, shapes)
    index = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    return {
        name: profile_candidate(task.folder, candidate_path, params, name, index, device=device)
    }


def _drive(argv: list[str]) -> None:
    """The profiled process: inputs for one shape, warm-up calls, then one call between
    cudaProfilerStart and cudaProfilerStop (the only kernels ncu counts)."""
    parser = argparse.ArgumentParser(prog="python -m loop.profiler drive")
    parser.add_argument("--task", required=True)
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--shape", required=True)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)
    os.dup2(2, 1)  # the candidate's prints must not mix with ncu's CSV on stdout

    import torch

    from loop.tasks import load_task

    task = load_task(args.task)
    shape = next((s for s in task.shapes(args.device) if s.name == args.shape), None)
    if shape is None:
        sys.exit(f"task {task.name} has no shape {args.shape!r} on {args.device}")
    on_cuda = args.device.startswith("cuda")
    if on_cuda:
        torch.cuda.set_device(torch.device(args.device))
    inputs = task.make_inputs(shape, shape.seed, args.device)
    spec = importlib.util.spec_from_file_location("autotune_profiled", args.candidate)
    if spec is None or spec.loader is None:
        sys.exit(f"cannot load {args.candidate}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = json.loads(args.params)
    for _ in range(WARMUP_CALLS):
        module.kernel(*inputs, **params)
    if not on_cuda:  # nothing to count: the CPU run only checks the driver itself
        module.kernel(*inputs, **params)
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    module.kernel(*inputs, **params)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["drive"]:
        sys.exit("usage: python -m loop.profiler drive --task ... --candidate ... --shape ...")
    _drive(sys.argv[2:])

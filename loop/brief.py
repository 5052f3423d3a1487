"""The brief a coding agent gets, generated per proposal as Markdown: the user's ideas first, then
the task and its shapes, the current best source with its per-shape results and bottlenecks (and
Nsight Compute counters where the caller profiled it), the results so far, hardware notes for the
GPU generation, model notes, and the rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from loop import guards
from loop.profiler import KernelCounters, ProfileResult
from loop.reasons import CODES
from loop.tasks import Task

NOTES_DIR = Path(__file__).resolve().parent / "notes"
# Below this floor (bytes/bandwidth and FLOPs/peak both tiny) a kernel is launch-bound.
LAUNCH_FLOOR_S = 3e-6
# Arithmetic intensity (FLOP per byte) above which a kernel is compute-bound when no measured
# ceilings exist (the CPU): a rough ridge point.
RIDGE_FLOP_PER_BYTE = 20.0

GENERATIONS = {
    "ampere": "Ampere",
    "ada": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}
# Task-name words that name a model family, and the notes file for it.
MODEL_WORDS = {
    "mla": "deepseek",
    "deepseek": "deepseek",
    "dsa": "deepseek",
    "gqa": "llama",
    "llama": "llama",
    "rmsnorm": "llama",
    "swiglu": "llama",
    "rope": "llama",
}

NEVER = [
    "breaking CUDA graphs: no host synchronisation, `.item()`, `.cpu()`, allocations that depend "
    "on values, or Python branching on tensor contents inside `kernel`; production replays "
    "graphs and a candidate that cannot be captured is rejected",
    "optimising only short contexts or small batches: every shape in the table counts, long "
    "contexts included; a kernel that wins decode and loses long context does not win",
    "editing anything but the candidate file (task.py, the harness, tests, seeds): every other "
    "file is hashed before and after your turn and any change rejects the proposal",
    "caching outputs across calls, reading the reference's result, lowering the precision owed, "
    "timing tricks (other streams, threads, patched timers): each is caught, see the codes",
]


@dataclass
class BriefInput:
    task: Task
    device: str
    candidate_name: str
    source: str
    params: dict
    ideas: list[str] = field(default_factory=list)
    shapes: list[str] | None = None
    medians_s: dict[str, float] = field(default_factory=dict)
    ceilings: dict | None = None
    results: list[dict] = field(default_factory=list)
    generation: str | None = None
    # Nsight Compute counters of the current best, per shape (None: not profiled this run).
    profiles: dict[str, ProfileResult] | None = None


def read_ideas(ideas: list[str] | tuple[str, ...], ideas_file: Path | None) -> list[str]:
    """--idea values, then the ideas file's (one idea per paragraph, blank-line separated)."""
    out = [i.strip() for i in ideas if i.strip()]
    if ideas_file is not None:
        text = Path(ideas_file).read_text()
        out += [p.strip() for p in text.split("\n\n") if p.strip()]
    return out


def generation_from_capability(major: int, minor: int) -> str | None:
    if major == 8:
        return "ada" if minor == 9 else "ampere"
    if major == 9:
        return "hopper"
    if major >= 10:
        return "blackwell"
    return None


def detect_generation(device: str) -> str | None:
    """The GPU generation of `device` (None on the CPU or an older GPU)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return generation_from_capability(*torch.cuda.get_device_capability())


def model_family(task: Task) -> str | None:
    declared = getattr(task.module, "MODEL_FAMILY", None)
    if isinstance(declared, str) and (NOTES_DIR / f"{declared}.md").is_file():
        return declared
    for word in task.name.lower().replace("-", "_").split("_"):
        if word in MODEL_WORDS:
            return MODEL_WORDS[word]
    return None


def notes(name: str) -> str:
    path = NOTES_DIR / f"{name}.md"
    return path.read_text().strip() if path.is_file() else ""


@dataclass
class Bottleneck:
    kind: str  # memory, compute, launch
    detail: str


def bottleneck(nbytes: int, flops: int, time_s: float | None, ceilings: dict | None) -> Bottleneck:
    """Which ceiling bounds this shape, from the roofline: bytes over the measured bandwidth
    against FLOPs over the peak, and how far the measured time is from the larger floor."""
    bw = (ceilings or {}).get("copy_bytes_per_s")
    peak = (ceilings or {}).get("flops_per_s")
    if not bw:
        intensity = flops / nbytes if nbytes else math.inf
        kind = "compute" if intensity > RIDGE_FLOP_PER_BYTE else "memory"
        rate = f"; {nbytes / time_s / 1e9:.2f} GB/s achieved" if time_s else ""
        return Bottleneck(
            kind, f"{intensity:.2f} FLOP/byte, no measured ceilings on this device{rate}"
        )
    t_mem = nbytes / bw
    t_comp = flops / peak if peak else 0.0
    floor = max(t_mem, t_comp)
    kind = "compute" if t_comp > t_mem else "memory"
    if floor < LAUNCH_FLOOR_S:
        kind = "launch"
    frac = f", {floor / time_s * 100:.0f} % of the roofline" if time_s else ""
    return Bottleneck(
        kind,
        f"floor {floor * 1e6:.2f} us (memory {t_mem * 1e6:.2f} us, compute "
        f"{t_comp * 1e6:.2f} us){frac}",
    )


def _fmt_s(t: float | None) -> str:
    if t is None:
        return "-"
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.3f} ms"


# Kernels shown per profiled shape: the longest ones, where the time goes.
MAX_KERNELS_SHOWN = 3


def _pct(value: float | None, digits: int) -> str | None:
    return None if value is None else f"{value:.{digits}f} %"


def counters_text(k: KernelCounters) -> str:
    """The key counters of one kernel in a sentence; counters ncu did not give are left out."""
    parts = []
    if k.dram_throughput_pct is not None:
        rate = k.memory_throughput_bytes_s
        parts.append(
            f"DRAM {k.dram_throughput_pct:.1f} % of peak"
            + (f" ({rate / 1e12:.2f} TB/s)" if rate else "")
        )
    for label, value, digits in (
        ("L2 hit", k.l2_hit_rate_pct, 0),
        ("L1 hit", k.l1_hit_rate_pct, 0),
    ):
        if value is not None:
            parts.append(f"{label} {_pct(value, digits)}")
    if k.achieved_occupancy_pct is not None:
        theory = k.theoretical_occupancy_pct
        parts.append(
            f"achieved occupancy {k.achieved_occupancy_pct:.1f} %"
            + (f" (theoretical {theory:g} %)" if theory is not None else "")
        )
    if k.compute_sm_throughput_pct is not None:
        parts.append(f"compute {k.compute_sm_throughput_pct:.0f} %")
    if k.occupancy_limiter == "registers" and k.block_limit_registers is not None:
        parts.append(f"occupancy limited by registers ({k.block_limit_registers:g} blocks/SM)")
    elif k.occupancy_limiter:
        parts.append(f"occupancy limited by {k.occupancy_limiter}")
    if k.local_spill_requests:
        parts.append(f"{k.local_spill_requests:g} local-memory spill requests")
    elif k.local_spill_requests == 0:
        parts.append("no register spills")
    return ", ".join(parts) or "no key counters reported"


def _dims_text(dims: tuple[int, ...]) -> str:
    """(32768, 1, 1) -> "32768", (16, 8, 1) -> "16x8"."""
    kept = list(dims)
    while len(kept) > 1 and kept[-1] == 1:
        kept.pop()
    return "x".join(str(d) for d in kept)


def _kernel_line(k: KernelCounters) -> str:
    name = k.name if len(k.name) <= 80 else k.name[:77] + "..."
    launch = [
        f"{label} {_dims_text(dims)}"
        for label, dims in (("grid", k.grid_size), ("block", k.block_size))
        if dims
    ]
    took = f", {_fmt_s(k.duration_ns * 1e-9)}" if k.duration_ns is not None else ""
    head = f"`{name}`" + (f" ({', '.join(launch)}{took})" if launch or took else "")
    return f"{head}: {counters_text(k)}"


def profile_lines(profiles: dict[str, ProfileResult] | None) -> list[str]:
    """The profiler section's lines: per profiled shape, its longest kernels' key counters, or
    why there are none."""
    if profiles is None:
        return ["No profiler counters: the current best was not profiled in this run."]
    if not profiles:
        return ["No profiler counters: no shape was profiled."]
    out = []
    for shape, p in profiles.items():
        if not p.available:
            out.append(f"- `{shape}`: no profiler counters ({p.reason}).")
            continue
        ranked = sorted(p.kernels, key=lambda k: -(k.duration_ns or 0.0))
        shown = ranked[:MAX_KERNELS_SHOWN]
        more = len(ranked) - len(shown)
        out.append(
            f"- `{shape}`: {len(ranked)} kernel(s) per call"
            + (f", the {len(shown)} longest shown" if more else "")
        )
        out += [f"  - {_kernel_line(k)}" for k in shown]
    return out


def build_brief(b: BriefInput) -> str:
    out = [f"# Brief: make `{b.candidate_name}` faster for task `{b.task.name}`", ""]
    out += ["## Ideas from the user (try these first)", ""]
    out += [f"- {i}" for i in b.ideas] or ["- (none given: use your judgement)"]
    out += ["", "## Task", ""]
    doc = (b.task.module.__doc__ or "").strip()
    out += [doc, ""] if doc else []
    out += [
        f"Edit only `{b.candidate_name}` in this folder. It defines "
        "`kernel(*inputs, **params)`, `LANGUAGE` and optionally a `PARAMS` search space (the loop "
        "tunes the parameters; you bring the code).",
        "",
        f"Device: `{b.device}`. Current parameters: `{b.params}`.",
        "",
        "| shape | dims | weight | bytes | FLOPs | time now | bottleneck | detail |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in b.task.shapes(b.device):
        if b.shapes and shape.name not in b.shapes:
            continue
        nbytes, flops = b.task.bytes_moved(shape), b.task.flops(shape)
        t = b.medians_s.get(shape.name)
        bn = bottleneck(nbytes, flops, t, b.ceilings)
        dims = ", ".join(f"{k}={v}" for k, v in shape.dims.items() if k not in ("name", "class"))
        out.append(
            f"| {shape.name} | {dims} | {shape.weight:g} | {nbytes} | {flops} | {_fmt_s(t)} "
            f"| {bn.kind} | {bn.detail} |"
        )
    out += ["", "Profiler counters (Nsight Compute) of the current best:", ""]
    out += profile_lines(b.profiles)
    out += ["", "## Current best source", "", "```python", b.source.rstrip(), "```", ""]
    out += ["## Results so far", ""]
    if b.results:
        out += ["| trial | status | speedup [interval] | reasons | description |"]
        out += ["| --- | --- | --- | --- | --- |"]
        for r in b.results:
            out.append(
                f"| {r['trial']} | {r['status']} | {r['speedup_text']} | {r['reasons']} "
                f"| {r['description']} |"
            )
    else:
        out.append("(no experiments yet)")
    gen = b.generation
    out += ["", f"## Hardware: {GENERATIONS.get(gen, 'no GPU detected')}", ""]
    out.append(notes(gen) if gen else "No GPU generation detected (running on the CPU).")
    family = model_family(b.task)
    if family:
        out += ["", "## Model notes", "", notes(family)]
    out += ["", "## Rules", "", "Never acceptable:", ""]
    out += [f"- {n}" for n in NEVER]
    out += ["", "The candidate file is checked before it runs; it may contain:", ""]
    out += [f"- {rule}" for rule in guards.rules()]
    out += [
        "",
        "Every proposal is verified on fresh inputs from a secret seed, timed under CUDA graphs "
        "interleaved with the incumbent, and kept only when the whole confidence interval of "
        "the speedup clears the noise floor. These rejections are caught (stable codes):",
        "",
    ]
    out += [f"- `{code}`: {text}" for code, text in CODES.items()]
    return "\n".join(out) + "\n"

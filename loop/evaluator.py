"""The evaluator's parent side: static checks, then the evaluation in a worker process (kept for
the next evaluation, loop/worker_pool.py) with time and memory limits; whatever the worker does,
the parent gets a verdict with stable reason codes.

`verify` checks correctness only; `bench` also times the candidates and the peers, interleaved.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from baselines.stats import summarize
from loop.guards import check_source, parse
from loop.reasons import Reason, reason
from loop.tasks import Task
from loop.worker_pool import ask, harness_env

DEFAULT_TIMEOUT_S = 600.0
# Fewer, shorter timing blocks (`evaluate`'s `rule`): wider intervals, for quick runs, small
# machines and the GPU sweeps of scripts/bench_tasks_gpu.py. Here, not in loop/driver.py (which
# imports optuna), so a sweep needs no optuna.
QUICK_RULE = {"samples_per_block": 5, "min_blocks": 4, "max_blocks": 10, "max_time_s": 0.5}
DEFAULT_CPU_MEMORY_BYTES = 12 * 2**30
# The folder holding this copy of the harness packages (loop/, baselines/, host_tuning/).
HARNESS_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CandidateSpec:
    path: Path
    params: dict = field(default_factory=dict)
    label: str = "candidate"


@dataclass
class ShapeResult:
    name: str
    rel_err: float | None = None
    blocks_s: list[float] = field(default_factory=list)
    method: str | None = None
    n_samples: int = 0
    dropped: dict | None = None  # a peer left out on this shape: the reason, as a dict
    telemetry: dict | None = None  # GPU clocks, temperature, power, re-measured blocks
    captures: int = 0  # CUDA graphs the blocks rotated through (0: not timed on a GPU)

    @property
    def median_s(self) -> float | None:
        return summarize(self.blocks_s).median if self.blocks_s else None


@dataclass
class Verdict:
    label: str
    kind: str
    params: dict
    accepted: bool
    reasons: list[Reason]
    shapes: dict[str, ShapeResult]
    language: str | None = None

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "kind": self.kind,
            "params": self.params,
            "language": self.language,
            "verdict": "accepted" if self.accepted else "rejected",
            "reasons": [r.to_dict() for r in self.reasons],
            "shapes": {name: asdict(s) for name, s in self.shapes.items()},
        }


@dataclass
class Evaluation:
    task: str
    device: str
    verdicts: list[Verdict]
    ceilings: dict | None
    seconds: float
    # Where the worker's time went: harness import, verification, timing (seconds); and
    # `worker_reused`: whether a worker kept from an earlier evaluation served this one.
    phases: dict = field(default_factory=dict)
    worker_pid: int | None = None  # the worker process that served it (None: none was needed)

    def by_label(self, label: str) -> Verdict:
        return next(v for v in self.verdicts if v.label == label)

    def best_peer(self, shape: str) -> Verdict | None:
        """The accepted peer with the lowest median time on `shape`, if any was timed there."""
        timed = [
            v
            for v in self.verdicts
            if v.kind == "peer"
            and v.accepted
            and shape in v.shapes
            and v.shapes[shape].blocks_s
            and not v.shapes[shape].dropped
        ]
        return min(timed, key=lambda v: v.shapes[shape].median_s, default=None)


@dataclass
class Limits:
    """`timeout_s` bounds each worker child (one candidate's verification, the peers', or one
    timing pass); the worker as a whole gets a multiple of it."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    cpu_memory_bytes: int = DEFAULT_CPU_MEMORY_BYTES
    gpu_mem_fraction: float = 0.9


def validate_params(path: Path, params: dict, space: dict | None) -> list[Reason]:
    if not params:
        return []
    if space is None:
        return [reason("bad-params", f"{path.name} has no PARAMS, but parameters were given")]
    problems = []
    for name, value in params.items():
        if name not in space:
            problems.append(
                reason("bad-params", f"unknown parameter {name!r}; PARAMS has {sorted(space)}")
            )
        elif value not in space[name]:
            problems.append(reason("bad-params", f"{name}={value!r} is not one of {space[name]!r}"))
    return problems


def read_params_space(source: str) -> dict | None:
    """PARAMS as a literal, read from the syntax tree (the candidate is not imported here)."""
    import ast

    tree = parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PARAMS" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def static_verdict(task: Task, spec: CandidateSpec) -> tuple[str | None, list[Reason]]:
    """Reasons found before any code runs: a missing file, static checks, bad parameters."""
    language, problems, _ = _checked(task, spec)
    return language, problems


def _checked(task: Task, spec: CandidateSpec) -> tuple[str | None, list[Reason], str | None]:
    """`static_verdict` and the text it checked: the worker runs that text, not the file, which
    could have changed since."""
    try:
        source = spec.path.read_text()
    except OSError as exc:
        return None, [reason("missing-file", f"{spec.path}: {exc.strerror or exc}")], None
    except UnicodeDecodeError as exc:
        why = f"{spec.path}: not UTF-8 text (byte {exc.start}: {exc.reason})"
        return None, [reason("syntax-error", why)], None
    forbidden = tuple(getattr(task.module, "FORBIDDEN_OPS", ()))
    report = check_source(source, str(spec.path), forbidden)
    if report.reasons:
        return report.language, report.reasons, source
    problems = validate_params(spec.path, spec.params, read_params_space(source))
    return report.language, problems, source


# Triton on the CPU runs under Triton's interpreter, where a kernel's loads and stores reach any
# host address (the harness's tolerance, its verdicts): no check in that process can hold.
TRUST_INTERPRETER_ENV = "AUTOTUNE_TRUST_TRITON_INTERPRETER"


def device_refusal(task: Task, language: str | None, device: str, source: str | None):
    """Why a candidate in `language` may not run on `device` (None when it may): CUDA and CuPy
    need a GPU; Triton on the CPU runs only the task's own shipped files, byte for byte, or any
    code the user says is trusted."""
    if device != "cuda" and language not in ("torch", "triton"):
        return reason(
            "unsupported-device", f"LANGUAGE {language!r} needs a GPU; device is {device}"
        )
    if device != "cpu" or language != "triton" or os.environ.get(TRUST_INTERPRETER_ENV) == "1":
        return None
    shipped = (f for f in task.folder.glob("*.py") if f.name != "task.py")
    if source is not None and any(f.read_text() == source for f in shipped):
        return None
    return reason(
        "unsupported-device",
        "Triton on the CPU runs under Triton's interpreter, whose loads and stores reach any "
        "host address, so only the task's shipped Triton files run there: evaluate on a GPU, "
        f"or set {TRUST_INTERPRETER_ENV}=1 for code you trust",
    )


def evaluate(
    task: Task,
    candidates: list[CandidateSpec],
    device: str,
    *,
    time_it: bool = False,
    peers: list[str] | None = None,
    shapes: list[str] | None = None,
    rule: dict | None = None,
    floor: dict | None = None,
    limits: Limits | None = None,
    seeds: int = 1,
) -> Evaluation:
    """Verify (and with `time_it`, time) `candidates` and `peers` on `device`. `seeds` > 1
    verifies every shape on that many fresh secret seeds."""
    labels = [spec.label for spec in candidates] + list(peers or [])
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        # The worker reports by label: two runs under one name would share one verdict.
        raise ValueError(f"candidate and peer labels must be unique; repeated: {repeated}")
    limits = limits or Limits()
    started = time.monotonic()
    pre: dict[str, tuple[str | None, list[Reason]]] = {}
    to_run = []
    for spec in candidates:
        language, problems, source = _checked(task, spec)
        refusal = None if problems else device_refusal(task, language, device, source)
        if refusal is not None:
            problems = [refusal]
        pre[spec.label] = (language, problems)
        if not problems:
            to_run.append(
                {
                    "label": spec.label,
                    "path": str(spec.path.resolve()),
                    "source": source,
                    "params": spec.params,
                }
            )
    request = {
        "task": str(task.folder),
        "device": device,
        "secret": secrets.randbits(62),
        "nonce": secrets.token_hex(16),
        "candidates": to_run,
        "peers": list(peers or []),
        "shapes": shapes,
        "time": time_it,
        "rule": rule or {},
        "floor": floor,
        "gpu_mem_fraction": limits.gpu_mem_fraction,
        "timeout_s": limits.timeout_s,
        "seeds": max(1, int(seeds)),
        "harness": str(HARNESS_ROOT),
    }
    worker_result, failure = (
        _run_worker(request, device, limits) if (to_run or peers) else ({"runners": []}, None)
    )
    verdicts = []
    listed = worker_result.get("runners", [])
    runners = {
        r["label"]: r
        for r in (listed if isinstance(listed, list) else [])
        if isinstance(r, dict) and isinstance(r.get("label"), str)
    }
    for spec in candidates:
        language, problems = pre[spec.label]
        if problems:
            verdicts.append(
                Verdict(spec.label, "candidate", spec.params, False, problems, {}, language)
            )
            continue
        verdicts.append(
            _to_verdict(
                runners.get(spec.label), spec.label, "candidate", spec.params, failure, language
            )
        )
    for name in peers or []:
        verdicts.append(_to_verdict(runners.get(name), name, "peer", {}, failure, None))
    return Evaluation(
        task.name,
        device,
        verdicts,
        worker_result.get("ceilings"),
        time.monotonic() - started,
        worker_result.get("phases") or {},
        worker_result.get("worker_pid"),
    )


def _to_verdict(raw, label, kind, params, failure: Reason | None, language) -> Verdict:
    if raw is None:
        why = failure or reason("crash", "the worker returned no result for this candidate")
        return Verdict(label, kind, params, False, [why], {}, language)
    try:
        return _parsed_verdict(raw, label, kind, params, language)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        why = reason("crash", f"the worker's result for this candidate is malformed: {exc!r}")
        return Verdict(label, kind, params, False, [why], {}, language)


def _parsed_verdict(raw: dict, label, kind, params, language) -> Verdict:
    reasons = [Reason(r["code"], r["message"]) for r in raw["reasons"]]
    shapes = {
        name: ShapeResult(
            name,
            s.get("rel_err"),
            s.get("blocks_s", []),
            s.get("method"),
            s.get("n_samples", 0),
            s.get("dropped"),
            s.get("telemetry"),
            s.get("captures", 0),
        )
        for name, s in raw["shapes"].items()
    }
    return Verdict(label, kind, params, not reasons, reasons, shapes, language)


def _backstop_s(request: dict, limits: Limits) -> float:
    """The whole worker's limit: every child may use its own, timing may be retried."""
    children = len(request["candidates"]) + 1
    if request["time"]:
        # a crash with several candidates runs each again apart (loop.worker._supervised)
        children += 2 + 2 * len(request["candidates"]) + len(request["peers"])
    return limits.timeout_s * children + 60.0


def _run_worker(request: dict, device: str, limits: Limits) -> tuple[dict, Reason | None]:
    """The worker's result for `request` (with `worker_reused` among its phases and the worker's
    pid), or why there is none."""
    # The harness comes from this copy, never from a candidate's folder or the current directory:
    # the worker runs with -P, and PYTHONPATH names this copy first.
    env = harness_env(HARNESS_ROOT)
    request = {**request, "cpu_memory_bytes": limits.cpu_memory_bytes}
    # CUDA maps far more virtual memory than it uses, so an address-space limit only fits the CPU.
    memory = limits.cpu_memory_bytes if device == "cpu" else None
    with tempfile.TemporaryDirectory(prefix="autotune-eval-") as cwd:
        reply = ask({**request, "cwd": cwd}, env, memory, _backstop_s(request, limits))
    result = dict(reply.result)
    result["phases"] = {**(result.get("phases") or {}), "worker_reused": reply.reused}
    result["worker_pid"] = reply.worker_pid
    return result, reply.failure

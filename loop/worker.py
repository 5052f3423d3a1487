"""The one place that loads untrusted candidate code: a worker process per evaluation.

`python -m loop.worker FD` reads a JSON request on stdin and writes one JSON result to file
descriptor FD. The request carries the secret seed, so the seed is never in the environment or on
the command line. The timer is imported before any candidate loads. Per candidate and shape:
the candidate runs first on its own inputs (outputs poisoned beforehand), then the float64
reference on private clones; then graph capture and interleaved timing against the other runners;
then re-verification of the timed graph's outputs on new values in the same input buffers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

TRITON_ON_CPU = "TRITON_INTERPRET"


@dataclass
class Runner:
    label: str
    kind: str  # "candidate" or "peer"
    fn: object
    params: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reasons


def _mix(secret: int, public: int, salt: int) -> int:
    digest = hashlib.sha256(f"{secret}:{public}:{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFFFFFFFFFFFFFF


def main() -> int:
    result_fd = int(sys.argv[1])
    request = json.loads(sys.stdin.read())
    device = request["device"]
    if device == "cpu":
        os.environ[TRITON_ON_CPU] = "1"
    out = os.fdopen(result_fd, "w")
    sys.stdout = sys.stderr  # whatever a candidate prints can never pass for a result
    try:
        result = evaluate(request)
    except BaseException as exc:  # the harness itself failed: say so, never hang the parent
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    result["nonce"] = request["nonce"]
    out.write(json.dumps(result))
    out.close()
    return 0


def evaluate(request: dict) -> dict:
    import torch

    from baselines import timer as timing
    from loop.reasons import reason
    from loop.tasks import load_task

    device = request["device"]
    secret = int(request["secret"])
    task = load_task(request["task"])
    shapes = [
        s for s in task.shapes(device) if not request.get("shapes") or s.name in request["shapes"]
    ]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    _let_compiled_peers_specialise(torch)
    if device == "cuda":
        torch.cuda.set_per_process_memory_fraction(float(request.get("gpu_mem_fraction", 0.9)))

    runners: list[Runner] = []
    for spec in request.get("candidates", []):
        runner = Runner(spec["label"], "candidate", None, spec.get("params") or {})
        try:
            runner.fn = _load_candidate(Path(spec["path"]), spec["label"])
        except Exception as exc:
            runner.reasons.append(reason("import-error", f"{type(exc).__name__}: {exc}"))
        runners.append(runner)
    for name in request.get("peers", []):
        runners.append(Runner(name, "peer", task.peers[name]))

    for shape in shapes:
        for runner in runners:
            if runner.ok:
                _verify(task, shape, runner, device, _mix(secret, shape.seed, 1), reason, torch)

    timer = None
    ceilings = None
    if request.get("time") and device == "cuda":
        from baselines.roofline import Ceilings, device_copy_bandwidth

        timer = timing.GpuTimer(device)
        floor = request.get("floor") or {}
        bandwidth = floor.get("copy_bytes_per_s") or device_copy_bandwidth(timer)
        ceilings = Ceilings(bandwidth, floor.get("flops_per_s"))
    if request.get("time"):
        rule = timing.StoppingRule(**request.get("rule", {}))
        for shape in shapes:
            _time_shape(task, shape, runners, device, secret, rule, timer, ceilings, reason, torch)

    broken = timing.tampered()
    for runner in runners:
        if broken and runner.kind == "candidate":
            runner.reasons.append(reason("timer-tampered", f"changed: {', '.join(broken)}"))
    return {
        "task": task.name,
        "device": device,
        "ceilings": None if ceilings is None else ceilings.__dict__,
        "runners": [
            {
                "label": r.label,
                "kind": r.kind,
                "params": r.params,
                "verdict": "accepted" if r.ok else "rejected",
                "reasons": [x.to_dict() for x in r.reasons],
                "shapes": r.shapes,
            }
            for r in runners
        ],
    }


def _let_compiled_peers_specialise(torch) -> None:
    """A torch.compile peer specialised per shape recompiles once per shape; past dynamo's
    recompile limit (8) it would silently run eager, a peer made slow by the harness. Allow
    one compilation per shape, and fail loudly (the peer is rejected) rather than fall back."""
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), 256))
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), 1024))
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        dynamo.fail_on_recompile_limit_hit = True


def _load_candidate(path: Path, label: str):
    name = f"autotune_candidate_{label}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def _poison_allocator(inputs: tuple, torch) -> None:
    """Fill the memory a fresh allocation would land on with NaN, so a leftover buffer shows."""
    nbytes = sum(t.numel() * t.element_size() for t in inputs if hasattr(t, "numel"))
    if not inputs or not hasattr(inputs[0], "device"):
        return
    dev = inputs[0].device
    poison = torch.full((max(nbytes, 1024) // 4 * 2,), float("nan"), device=dev)
    del poison


def _check_outputs(task, shape, outputs, refs, runner, reason, torch) -> str | None:
    """None when the outputs are right; else the first reason code, appended to runner.reasons."""
    outputs = _as_tuple(outputs)
    if len(outputs) != len(refs):
        runner.reasons.append(
            reason(
                "wrong-output-type", f"{shape.name}: {len(outputs)} outputs, expected {len(refs)}"
            )
        )
        return "wrong-output-type"
    dtype = getattr(torch, shape.dtype)
    tol = task.tolerance(shape.dtype)
    worst = 0.0
    for out, ref in zip(outputs, refs, strict=True):
        if type(out) is not torch.Tensor or out.layout != torch.strided or out.is_sparse:
            runner.reasons.append(
                reason(
                    "wrong-output-type",
                    f"{shape.name}: got {type(out).__name__}, not a plain dense torch.Tensor",
                )
            )
            return "wrong-output-type"
        want = torch.empty(ref.shape, dtype=dtype)
        if (
            out.shape != ref.shape
            or out.dtype != dtype
            or out.device.type != ref.device.type
            or out.stride() != want.stride()
        ):
            runner.reasons.append(
                reason(
                    "wrong-output-layout",
                    f"{shape.name}: got shape {tuple(out.shape)} {out.dtype} {out.device.type} strides {out.stride()}, "
                    f"expected {tuple(ref.shape)} {dtype} {ref.device.type} strides {want.stride()}",
                )
            )
            return "wrong-output-layout"
        got = out.to(torch.float64)
        finite_ref = torch.isfinite(ref)
        if not bool(torch.isfinite(got)[finite_ref].all()):
            runner.reasons.append(
                reason("non-finite-output", f"{shape.name}: NaN or Inf in the output")
            )
            return "non-finite-output"
        if (
            got.numel() > 1
            and float(got.max() - got.min()) == 0.0
            and float(ref.max() - ref.min()) != 0.0
        ):
            runner.reasons.append(
                reason(
                    "constant-output", f"{shape.name}: every element is {float(got.flatten()[0])}"
                )
            )
            return "constant-output"
        err = float(
            torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300)
        )
        worst = max(worst, err)
        if err > tol:
            runner.reasons.append(
                reason(
                    "mismatch",
                    f"{shape.name}: relative error {err:.3g} > tolerance {tol:.3g} ({shape.dtype})",
                )
            )
            return "mismatch"
    runner.shapes.setdefault(shape.name, {})["rel_err"] = worst
    return None


def _reference(task, inputs, torch) -> tuple:
    return _as_tuple(
        task.reference(*[t.to(torch.float64) if t.is_floating_point() else t for t in inputs])
    )


def _call(runner: Runner, inputs: tuple):
    return runner.fn(*inputs, **runner.params)


def _verify(task, shape, runner: Runner, device: str, seed: int, reason, torch) -> None:
    inputs = task.make_inputs(shape, seed, device)
    clones = tuple(t.clone() for t in inputs)
    try:
        if device == "cuda":
            _poison_allocator(inputs, torch)
        outputs = _call(runner, inputs)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:
        runner.reasons.append(_classify(exc, shape.name, reason, torch))
        return
    for got, want in zip(inputs, clones, strict=True):
        if not torch.equal(got, want):
            runner.reasons.append(
                reason("inputs-modified", f"{shape.name}: an input changed during the call")
            )
            return
    refs = _reference(task, clones, torch)
    _check_outputs(task, shape, outputs, refs, runner, reason, torch)


def _classify(exc: BaseException, where: str, reason, torch):
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return reason("out-of-memory", f"{where}: {type(exc).__name__}: {exc}"[:500])
    return reason("crash", f"{where}: {type(exc).__name__}: {exc}"[:500])


def _time_shape(task, shape, runners, device, secret, rule, timer, ceilings, reason, torch) -> None:
    """Every runner reads the same input buffers (so no runner gains from where its inputs
    landed), timed interleaved; afterwards new values go into those buffers and each
    candidate's timed path runs once more and is checked again."""
    from baselines import timer as timing

    live = [r for r in runners if r.ok]
    inputs = task.make_inputs(shape, _mix(secret, shape.seed, 2), device)
    bound = []  # (runner, block(n) -> samples, replay() -> outputs of the timed path)
    for runner in live:
        try:
            if device == "cuda":
                graph, out = timer.capture(lambda r=runner: _call(r, inputs))
                block = lambda n, g=graph: timer.block(g, n)  # noqa: E731
                replay = lambda g=graph, o=out: (g.replay(), torch.cuda.synchronize(), o)[2]  # noqa: E731
            else:
                call = lambda r=runner: _call(r, inputs)  # noqa: E731
                block = lambda n, c=call: timing.cpu_block(c, n)  # noqa: E731
                replay = call
        except timing.CaptureError as exc:
            runner.reasons.append(reason("graph-capture-failed", f"{shape.name}: {exc}"[:500]))
            continue
        except Exception as exc:
            runner.reasons.append(_classify(exc, shape.name, reason, torch))
            continue
        bound.append((runner, block, replay))
    if not bound:
        return
    try:
        medians = timing.run_interleaved([b[1] for b in bound], rule)
    except Exception as exc:
        for runner, *_ in bound:
            runner.reasons.append(_classify(exc, shape.name, reason, torch))
        return
    floor = ceilings.floor_s(task.bytes_moved(shape), task.flops(shape)) if ceilings else 0.0
    fresh = task.make_inputs(shape, _mix(secret, shape.seed, 99), device)
    for buf, new in zip(inputs, fresh, strict=True):
        buf.copy_(new)
    refs = None
    for (runner, _, replay), blocks in zip(bound, medians, strict=True):
        entry = runner.shapes.setdefault(shape.name, {})
        entry.update(
            blocks_s=blocks,
            n_samples=len(blocks) * rule.samples_per_block,
            method="cuda-graph" if device == "cuda" else "host-clock",
        )
        if runner.kind != "candidate":
            continue
        if min(blocks) < floor:
            runner.reasons.append(
                reason(
                    "faster-than-physics",
                    f"{shape.name}: {min(blocks) * 1e6:.2f} us is under the floor of {floor * 1e6:.2f} us",
                )
            )
            continue
        refs = refs if refs is not None else _reference(task, fresh, torch)
        _reverify(shape, runner, replay, refs, task, reason, torch)


def _reverify(shape, runner, replay, refs, task, reason, torch) -> None:
    """One more call of the timed path on the new values, compared with the reference."""
    try:
        outputs = replay()
    except Exception as exc:
        runner.reasons.append(_classify(exc, shape.name, reason, torch))
        return
    probe = Runner(runner.label, runner.kind, runner.fn)
    if _check_outputs(task, shape, outputs, refs, probe, reason, torch):
        runner.reasons.append(
            reason("reverify-mismatch", f"after timing: {probe.reasons[0].message}")
        )


if __name__ == "__main__":
    sys.exit(main())

"""The one place that loads untrusted candidate code: the worker's supervisor, which handles one
evaluation request by forking a child per candidate (loop/worker_child.py).

The worker process (loop/worker_serve.py) imports the harness and the timer, never a candidate,
and never touches the GPU: the children it forks do. The request carries the secret seed, so the
seed is never in the environment or on the command line.

- Verification: each candidate in its own child (a crash, hang, exit, segfault or OOM there
  rejects that candidate and nothing else); the peers together in one more child, sharing each
  shape's inputs and reference. Per candidate and shape: the candidate runs first on its own
  inputs (outputs poisoned beforehand), then the float64 reference on private clones.
- Timing: the candidates that passed and the peers in one child, interleaved, input values
  rotated in the same buffers between samples (CPU) or blocks (GPU, outside the timed region);
  then re-verification of the timed path on perturbed and on new values in the same buffers.
  The child writes a progress mark before each runner acts; if it dies, `_supervised` decides
  who could have killed it (the last mark alone is not enough: a candidate can crash the child
  while another runner's block runs) and timing runs again without that runner.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import gc
import hashlib
import importlib.util
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loop import global_state, guards
from loop.worker_child import Channel, ChildSettings, run_child

CANDIDATE_MODULE_PREFIX = "autotune_candidate_"
FRESH_SALT = (
    10_000  # timing draws value set FRESH_SALT + k for its k-th sample (CPU) or block (GPU)
)
# Share of elements changed by each perturbed re-verification; 0.0 changes the one forced element
# only. A cache keyed on k of n sampled values misses every round with odds of about
# 0.02k * 0.002k * k/n (k=4, n=1792: 1.4e-6); without the last round, 0.02k * 0.002k (6e-4).
PERTURB_FRACTIONS = (0.02, 0.002, 0.0)

# Memory held by one runner's captures of one shape (outputs and intermediates in each graph's
# pool), at most: a peer that upcasts a 150k-vocabulary batch holds 10 GB in each of its captures,
# and eight of them, next to the other runners', left no room for the re-verification's float64
# reference on the H200.
CAPTURE_BYTES = 1 << 30
TIMED_CHECK_SHARE = 0.25  # of a candidate's timed outputs on the CPU, checked against the reference
_DRAW = random.SystemRandom()  # which timed outputs are checked: nothing the candidate can seed


@dataclass
class Runner:
    label: str
    kind: str  # "candidate" or "peer"
    fn: object
    params: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)
    path: str | None = None
    source: str | None = None  # the text the static checks passed (run instead of the file)
    strided_inputs: bool = False  # it declares STRIDED_INPUTS: verified on views too

    @property
    def ok(self) -> bool:
        return not self.reasons

    def dropped(self, shape: str) -> bool:
        return "dropped" in self.shapes.get(shape, {})

    def drop(self, shape: str, why) -> None:
        """A peer that fails on one shape is left out there only; a candidate is rejected."""
        if self.kind == "peer":
            self.shapes.setdefault(shape, {})["dropped"] = why.to_dict()
        else:
            self.reasons.append(why)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "kind": self.kind,
            "params": self.params,
            "verdict": "accepted" if self.ok else "rejected",
            "reasons": [x.to_dict() for x in self.reasons],
            "shapes": self.shapes,
        }


@dataclass
class Context:
    """What every child needs: the request, the task, and the harness modules bound before any
    candidate loads."""

    request: dict
    task: object
    shapes: list
    device: str
    secret: int
    seeds: int
    torch: object
    timing: object
    reason: Callable
    children: ChildSettings
    state: dict = field(default_factory=dict)  # global torch state before candidates load


def _mix(secret: int, public: int, salt: int) -> int:
    digest = hashlib.sha256(f"{secret}:{public}:{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFFFFFFFFFFFFFF


def _verify_salt(k: int) -> int:
    return 1 if k == 0 else 1000 + k


RAGGED_SALT = 7919  # draws the length of a shape's ragged twin
RAGGED_CHECKED = 3  # ragged twins verified a shape (each length a fresh draw)
RAGGED_DRAWS = 12  # twins drawn a shape at most, refused ones included
REFUSED = object()  # what _verify gives for a twin the candidate refused (a ValueError)


def _check_harness_origin(root: str | None) -> None:
    """The harness must come from the evaluator's own copy, never from a candidate's folder."""
    import baselines
    import loop

    if root is None:
        return
    for module in (loop, baselines):
        where = Path(module.__file__).resolve()
        if Path(root).resolve() not in where.parents:
            raise ImportError(f"{module.__name__} was imported from {where}, not from {root}")


def supervise(request: dict, since: float, children: ChildSettings | None = None) -> dict:
    """Verify (and time) one request's candidates and peers, each group in forked children.
    `since`: when this request began importing the harness (its `harness_import_s`)."""
    _check_harness_origin(request.get("harness"))
    import torch

    from baselines import timer as timing
    from loop.reasons import reason
    from loop.tasks import load_task

    device = request["device"]
    task = load_task(request["task"])
    # Only peers may compile; importing dynamo takes seconds, so only when one will.
    if "torch._dynamo" in sys.modules or any("compile" in p for p in request.get("peers", [])):
        _let_compiled_peers_specialise(torch)
    wanted = request.get("shapes")
    shapes = [s for s in task.shapes(device) if not wanted or s.name in wanted]
    ctx = Context(
        request,
        task,
        shapes,
        device,
        int(request["secret"]),
        max(1, int(request.get("seeds", 1))),
        torch,
        timing,
        reason,
        children or ChildSettings(),
    )
    timeout = float(request.get("timeout_s", 600.0))
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised before the worker forked (by the task module?)")

    candidates = [
        Runner(
            s["label"],
            "candidate",
            None,
            s.get("params") or {},
            path=s["path"],
            source=s.get("source"),
        )
        for s in request.get("candidates", [])
    ]
    peers = [Runner(name, "peer", None) for name in request.get("peers", [])]

    started = time.monotonic()
    phases = {"harness_import_s": started - since}
    for runner in candidates:
        _supervised(ctx, [runner], _verify_body, timeout)
    phases["verify_candidates_s"] = time.monotonic() - started
    if peers:
        _supervised(ctx, peers, _verify_body, timeout)
    phases["verify_s"] = time.monotonic() - started
    _reject_peers_dropped_everywhere(peers, shapes, reason)

    ceilings = None
    if request.get("time"):
        live = [r for r in (*candidates, *peers) if r.ok]
        if live:
            ceilings = _supervised(ctx, live, _time_body, timeout)
        _reject_peers_dropped_everywhere(peers, shapes, reason)
    phases["total_s"] = time.monotonic() - started
    phases["timing_s"] = phases["total_s"] - phases["verify_s"]
    return {
        "task": task.name,
        "device": device,
        "ceilings": ceilings,
        "phases": phases,
        "runners": [r.to_dict() for r in (*candidates, *peers)],
    }


def _reject_peers_dropped_everywhere(peers: list[Runner], shapes: list, reason) -> None:
    """A peer left out on every shape (in verification or in timing) is rejected, so that its
    missing times cannot read as an accepted peer that lost."""
    for peer in peers:
        if peer.ok and shapes and all(peer.dropped(s.name) for s in shapes):
            first = peer.shapes[shapes[0].name]["dropped"]
            peer.reasons.append(reason(first["code"], f"on every shape: {first['message']}"))


# ---------------------------------------------------------------------------------------------
# children


def _supervised(ctx: Context, runners: list[Runner], body, timeout_s: float):
    """Run `body(ctx, runners, excluded, chan)` in a child until it finishes, and return its
    extra result. When the child dies, who is convicted depends on who could have done it:

    - a timeout convicts the runner named by the child's last mark (a peer: for that shape);
    - a crash in a child of peers alone convicts the marked peer, for that shape;
    - a crash in a child holding one candidate convicts that candidate, whoever the mark
      names: peers are trusted code, and a candidate can crash the child while a peer's block
      runs (deferred work, a finalizer) to get the peer dropped;
    - a crash in a child holding several candidates convicts none of them yet: each is run
      again on that shape in a child of its own with the peers, where the rule above applies;
      the survivors keep those results, and the shared child runs again without them there.

    Each runner and shape is retried at most once."""
    excluded: set[tuple[str, str]] = set()
    by_label = {r.label: r for r in runners}
    for _ in range(len(runners) * max(1, len(ctx.shapes)) + 1):
        live = [r for r in runners if r.ok]
        if not live:
            return None
        outcome = run_child(
            lambda chan, rs=live: body(ctx, rs, excluded, chan), timeout_s, ctx.children
        )
        if outcome.result is not None:
            _merge(ctx, by_label, outcome.result)
            return outcome.result.get("extra")
        why_code = outcome.failure or "crash"
        if outcome.last_mark is None or outcome.last_mark[0] not in by_label:
            for runner in live:
                runner.reasons.append(ctx.reason(why_code, f"worker child: {outcome.message}"))
            return None
        label, shape = outcome.last_mark
        why = ctx.reason(why_code, f"{shape}: {outcome.message}"[:500])
        suspects = [
            r
            for r in live
            if r.kind == "candidate" and (r.label, shape) not in excluded and not r.dropped(shape)
        ]
        if why_code == "timeout" or not suspects:
            by_label[label].drop(shape, why)
            excluded.add((label, shape))
        elif len(suspects) == 1:
            suspects[0].drop(shape, why)
            excluded.add((suspects[0].label, shape))
        else:
            _apart(ctx, shape, suspects, [r for r in live if r.kind == "peer"], body, timeout_s)
            excluded.update((r.label, shape) for r in suspects)
    for runner in runners:
        if runner.ok:
            runner.reasons.append(ctx.reason("crash", "worker children kept dying"))
    return None


def _merge(ctx: Context, by_label: dict[str, Runner], result: dict) -> None:
    """A child's verdicts and per-shape entries into the supervisor's runners."""
    for raw in result["runners"]:
        runner = by_label[raw["label"]]
        runner.reasons.extend(ctx.reason(r["code"], r["message"]) for r in raw["reasons"])
        for shape, entry in raw["shapes"].items():
            runner.shapes.setdefault(shape, {}).update(entry)


def _apart(ctx: Context, shape_name: str, suspects: list[Runner], peers, body, timeout_s) -> None:
    """Each of `suspects` on one shape in its own child with `peers` (whose results there are
    not kept: the shared child times them again)."""
    shape = next(s for s in ctx.shapes if s.name == shape_name)
    alone = dataclasses.replace(ctx, shapes=[shape])
    for suspect in suspects:
        stand_ins = []
        for peer in peers:
            stand_in = Runner(peer.label, peer.kind, None, peer.params, path=peer.path)
            stand_in.shapes = {s: dict(e) for s, e in peer.shapes.items() if "dropped" in e}
            stand_ins.append(stand_in)
        _supervised(alone, [suspect, *stand_ins], body, timeout_s)


def _wire(runners: list[Runner]) -> dict:
    return {"runners": [r.to_dict() for r in runners]}


def _load_runners(ctx: Context, runners: list[Runner], chan: Channel) -> list[Runner]:
    """Fresh copies of `runners` for this child, their callables loaded here."""
    out = []
    for r in runners:
        if r.kind == "candidate":
            chan.mark(r.label, "(import)")
        copy = Runner(r.label, r.kind, None, r.params, path=r.path, source=r.source)
        copy.shapes = {s: dict(e) for s, e in r.shapes.items() if "dropped" in e}
        try:
            if r.kind == "candidate":
                copy.fn, copy.strided_inputs = _load_candidate(Path(r.path), r.label, r.source)
                left = _state_left(ctx)
                if left:
                    copy.reasons.append(ctx.reason("forbidden-call", f"importing it {left}"))
            elif not ctx.task.peer_runs_on(r.label, ctx.device):
                copy.reasons.append(
                    ctx.reason("unsupported-device", f"peer {r.label} does not run on {ctx.device}")
                )
            else:
                copy.fn = ctx.task.peers[r.label]
        except BaseException as exc:
            copy.reasons.append(ctx.reason("import-error", f"{type(exc).__name__}: {exc}"[:500]))
        out.append(copy)
    return out


def _prepare_device(ctx: Context) -> None:
    torch = ctx.torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if ctx.device == "cuda":
        torch.cuda.set_per_process_memory_fraction(float(ctx.request.get("gpu_mem_fraction", 0.9)))


def _tamper_check(ctx: Context, runners: list[Runner]) -> None:
    broken = ctx.timing.tampered()
    for runner in runners:
        if broken and runner.kind == "candidate":
            runner.reasons.append(ctx.reason("timer-tampered", f"changed: {', '.join(broken)}"))


def _verify_body(ctx: Context, runners: list[Runner], excluded, chan: Channel) -> dict:
    _prepare_device(ctx)
    if ctx.device == "cpu":  # correctness needs no threads, and a busy host makes them wait
        ctx.torch.set_num_threads(1)
    ctx.state = global_state.snapshot(ctx.torch, _task_names(ctx))
    runners = _load_runners(ctx, runners, chan)
    share = all(r.kind == "peer" for r in runners)  # never share a reference with a candidate
    for shape in ctx.shapes:
        for k in range(ctx.seeds):
            cache: dict = {}
            for runner in runners:
                if not runner.ok or runner.dropped(shape.name):
                    continue
                if (runner.label, shape.name) in excluded:
                    continue
                chan.mark(runner.label, shape.name)
                seed = _mix(ctx.secret, shape.seed, _verify_salt(k))
                why = _verify(ctx, shape, runner, seed, cache if share else None)
                if why is not None:
                    runner.drop(shape.name, why)
            cache.clear()
        for runner in runners:
            if runner.kind != "candidate" or not runner.ok or runner.dropped(shape.name):
                continue
            if (runner.label, shape.name) in excluded:
                continue
            why = _verify_ragged_twins(ctx, shape, runner, chan)
            if why is not None:
                runner.drop(shape.name, why)
    if ctx.device == "cuda" and ctx.shapes:
        for runner in runners:
            if runner.kind == "candidate" and runner.ok:
                chan.mark(runner.label, ctx.shapes[0].name)
                _capture_check(ctx, runner, ctx.shapes[0])
    _tamper_check(ctx, runners)
    return _wire(runners)


def _verify_ragged_twins(ctx: Context, shape, runner: Runner, chan: Channel):
    """None when `runner` is right at RAGGED_CHECKED ragged twins of `shape` (the task's, if it
    has them), refusing the others it is given, within RAGGED_DRAWS draws; else the reason. A
    refused twin draws another length, and more than one length is checked, so that refusing one
    class of lengths (the odd ones, say) does not hide a wrong answer at another."""
    checked = 0
    for draw in range(RAGGED_DRAWS):
        twin = ctx.task.ragged_twin(shape, _mix(ctx.secret, shape.seed, RAGGED_SALT + draw))
        if twin is None:
            return None
        chan.mark(runner.label, shape.name)
        seed = _mix(ctx.secret, twin.seed, _verify_salt(0))
        why = _verify(ctx, twin, runner, seed, None, twin=True)
        if why is REFUSED:
            continue
        if why is not None:
            return why
        checked += 1
        if checked == RAGGED_CHECKED:
            return None
    return None


def _capture_check(ctx: Context, runner: Runner, shape) -> None:
    """Production runs under CUDA graphs: a candidate that cannot be captured is rejected by
    verification too, never first inside the process that times everyone."""
    timer = ctx.timing.GpuTimer(ctx.device, flush_l2=False)
    inputs = ctx.task.make_inputs(shape, _mix(ctx.secret, shape.seed, 7), ctx.device)
    try:
        timer.capture(lambda: _call(runner, inputs))
    except ctx.timing.CaptureError as exc:
        runner.reasons.append(ctx.reason("graph-capture-failed", f"{shape.name}: {exc}"[:500]))


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


def _load_candidate(path: Path, label: str, source: str | None = None) -> tuple:
    """The candidate's kernel, and whether it declares STRIDED_INPUTS (decoder blocks then pass
    it views, so verification gives it views too)."""
    name = f"{CANDIDATE_MODULE_PREFIX}{label}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # The tree the static checks passed, compiled here: `source` is the text they read (the
    # file may have been swapped since), less the self-test block they skipped. Compiled without
    # this file's `from __future__` flags (which would turn the candidate's annotations into
    # strings) and registered in sys.modules only while its body runs (dataclasses looks its
    # module up there); afterwards no other candidate can find it there by name.
    text = source if source is not None else Path(path).read_text()
    tree = guards.without_self_tests(ast.parse(text, filename=str(path)))
    code = compile(tree, str(path), "exec", dont_inherit=True)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module.kernel, guards.declares_strided_inputs(module)


def _as_tuple(value) -> tuple:
    """The outputs of a call: the items of an exact tuple or list (never a subclass, whose own
    iteration could do the work only when the harness looks), else the value itself."""
    if type(value) is tuple:
        return value
    if type(value) is list:
        return tuple(value)
    return (value,)


def _poison_outputs(out, inputs: tuple) -> None:
    """Overwrite a capture's outputs (NaN, or -1 for integers) before it replays, except an
    output that is one of the inputs' buffers."""
    taken = {t.untyped_storage().data_ptr() for t in inputs if hasattr(t, "untyped_storage")}
    for t in _as_tuple(out):
        if not hasattr(t, "untyped_storage") or t.untyped_storage().data_ptr() in taken:
            continue
        t.fill_(float("nan") if t.is_floating_point() else -1)


def _poison_allocator(inputs: tuple, torch) -> None:
    """Fill the memory a fresh allocation would land on with NaN, so a leftover buffer shows."""
    nbytes = sum(t.numel() * t.element_size() for t in inputs if hasattr(t, "numel"))
    if not inputs or not hasattr(inputs[0], "device"):
        return
    dev = inputs[0].device
    poison = torch.full((max(nbytes, 1024) // 4 * 2,), float("nan"), device=dev)
    del poison


def _check_outputs(ctx: Context, shape, outputs, refs, peer: bool = False):
    """(None, worst relative error) when the outputs are right; else (the reason, None). A
    peer is held to the task's PEER_TOLERANCE where it has one."""
    torch, reason, task = ctx.torch, ctx.reason, ctx.task
    outputs = _as_tuple(outputs)
    if len(outputs) != len(refs):
        return reason(
            "wrong-output-type", f"{shape.name}: {len(outputs)} outputs, expected {len(refs)}"
        ), None
    worst = 0.0
    dtypes = task.output_dtypes(shape, len(refs))
    for i, (out, ref, dtype_name) in enumerate(zip(outputs, refs, dtypes, strict=True)):
        where = f"{shape.name}" + (f" output {i}" if len(refs) > 1 else "")
        if type(out) is not torch.Tensor or out.layout != torch.strided or out.is_sparse:
            return reason(
                "wrong-output-type",
                f"{where}: got {type(out).__name__}, not a plain dense torch.Tensor",
            ), None
        dtype = getattr(torch, dtype_name)
        want = torch.empty(ref.shape, dtype=dtype)
        # is_contiguous: the default strides, except on size-1 dims, where a stride moves nothing
        if (
            out.shape != ref.shape
            or out.dtype != dtype
            or out.device.type != ref.device.type
            or not out.is_contiguous()
        ):
            return reason(
                "wrong-output-layout",
                f"{where}: got shape {tuple(out.shape)} {out.dtype} {out.device.type} strides "
                f"{out.stride()}, expected {tuple(ref.shape)} {dtype} {ref.device.type}, "
                f"contiguous (strides {want.stride()})",
            ), None
        got = out.to(torch.float64)
        finite_ref = torch.isfinite(ref)
        if not bool(torch.isfinite(got)[finite_ref].all()):
            return reason("non-finite-output", f"{where}: NaN or Inf in the output"), None
        if (
            got.numel() > 1
            and float(got.max() - got.min()) == 0.0
            and float(ref.max() - ref.min()) != 0.0
        ):
            return reason(
                "constant-output", f"{where}: every element is {float(got.flatten()[0])}"
            ), None
        tol = task.tolerance(dtype_name, peer=peer)
        err = float(
            torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300)
        )
        worst = max(worst, err)
        if err > tol:
            return reason(
                "mismatch",
                f"{where}: relative error {err:.3g} > tolerance {tol:.3g} ({dtype_name})",
            ), None
        ord_ = task.row_error_ord
        if ord_ is not None and got.dim() > 0 and got.numel() > 0:
            rows = torch.linalg.vector_norm(got - ref, ord_, dim=-1) / torch.linalg.vector_norm(
                ref, ord_, dim=-1
            ).clamp_min(1e-300)
            row_err = float(rows.max())
            if row_err > tol:
                row = int(rows.flatten().argmax())
                return reason(
                    "mismatch",
                    f"{where}: row {row}'s relative error in the {ord_}-norm {row_err:.3g} > "
                    f"tolerance {tol:.3g} ({dtype_name})",
                ), None
    return None, worst


def _reference(task, inputs, torch) -> tuple:
    return _as_tuple(
        task.reference(*[t.to(torch.float64) if t.is_floating_point() else t for t in inputs])
    )


def _call(runner: Runner, inputs: tuple):
    return runner.fn(*inputs, **runner.params)


def _verify(ctx: Context, shape, runner: Runner, seed: int, cache: dict | None, twin: bool = False):
    """None when `runner` is right on `shape` with inputs from `seed`; else the reason. With a
    `cache` (peers only) the inputs and the reference are drawn and computed once per seed. A
    shape's ragged `twin` may be refused with a ValueError (REFUSED: the decoder blocks run the
    eager op where a kernel refuses its inputs), and its error is not the shape's."""
    torch, task, device = ctx.torch, ctx.task, ctx.device
    if cache is not None and "inputs" in cache:
        inputs = tuple(t.clone() for t in cache["inputs"])
    else:
        inputs = task.make_inputs(shape, seed, device)
    clones = tuple(t.clone() for t in inputs)
    layouts = [_layout(t) for t in inputs]
    try:
        if device == "cuda":
            _poison_allocator(inputs, torch)
        outputs = _call(runner, inputs)
        if device == "cuda":
            torch.cuda.synchronize()
    except BaseException as exc:
        _state_left(ctx)
        if twin and type(exc) is ValueError:
            return REFUSED
        return _classify(exc, shape.name, ctx.reason)
    left = _state_left(ctx)
    if left and runner.kind == "candidate":
        return ctx.reason("forbidden-call", f"{shape.name}: the call {left}")
    if not _unchanged(inputs, clones, layouts):
        return ctx.reason("inputs-modified", f"{shape.name}: an input changed during the call")
    if cache is not None:
        if "refs" not in cache:
            cache["inputs"] = clones
            cache["refs"] = _reference(task, clones, torch)
        refs = cache["refs"]
    else:
        refs = _reference(task, clones, torch)
    why, worst = _check_outputs(ctx, shape, outputs, refs, peer=runner.kind == "peer")
    if why is None and runner.strided_inputs:
        why, worst_views = _verify_on_views(ctx, shape, runner, clones, refs, seed)
        worst = max(worst, worst_views or 0.0)
    if why is None and not twin:
        entry = runner.shapes.setdefault(shape.name, {})
        entry["rel_err"] = max(worst, entry.get("rel_err") or 0.0)
    return why


def _padded_views(inputs: tuple, seed: int, torch) -> tuple[tuple, tuple]:
    """(views, buffers): each tensor input copied into a view of a larger buffer with 8 more
    elements in the last dim and (2-D and up) one more row in the second-to-last, so the view's
    strides are not a contiguous tensor's (nor is the third-from-last stride the second-from-
    last's times its extent); the buffer's other elements random (floating point) or zero."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    views, buffers = [], []
    for t in inputs:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            views.append(t)
            continue
        pad = [0] * (t.dim() - 2) + [1] * min(t.dim() - 1, 1) + [8]
        shape = [n + p for n, p in zip(t.shape, pad, strict=True)]
        if t.is_floating_point():
            buffer = torch.randn(shape, generator=gen, dtype=torch.float32).to(t.dtype)
        else:
            buffer = torch.zeros(shape, dtype=t.dtype)
        buffer = buffer.to(t.device)
        view = buffer[tuple(slice(0, n) for n in t.shape)]
        view.copy_(t)
        views.append(view)
        buffers.append(buffer)
    return tuple(views), tuple(buffers)


def _verify_on_views(ctx: Context, shape, runner: Runner, inputs: tuple, refs, seed: int):
    """A candidate that declares STRIDED_INPUTS, on its inputs as views into larger buffers: its
    outputs are right and the buffers, gaps included, unchanged. (None, worst) or (why, None)."""
    views, buffers = _padded_views(inputs, seed, ctx.torch)
    source = tuple(b.clone() for b in buffers)
    layouts = [_layout(b) for b in buffers]
    try:
        outputs = _call(runner, views)
        if ctx.device == "cuda":
            ctx.torch.cuda.synchronize()
    except BaseException as exc:
        _state_left(ctx)
        return _classify(exc, f"{shape.name} (strided inputs)", ctx.reason), None
    left = _state_left(ctx)
    if left:
        return ctx.reason("forbidden-call", f"{shape.name} (strided inputs): the call {left}"), None
    if not _unchanged(buffers, source, layouts):
        why = f"{shape.name}: a strided input's buffer changed during the call"
        return ctx.reason("inputs-modified", why), None
    return _check_outputs(
        ctx, dataclasses.replace(shape, name=f"{shape.name} (strided inputs)"), outputs, refs
    )


class _InputsModified(Exception):
    """A timed or re-verified call changed its input buffers."""


def _layout(t) -> tuple:
    """What makes a buffer the same buffer for the next runner: its memory, its view of it, and
    no autograd (`x.set_(...)` or `x.requires_grad_()` keep the values and tax every later op)."""
    return (
        type(t),
        t.data_ptr(),
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.dtype,
        t.requires_grad,
        t.grad_fn is None,
    )


def _unchanged(inputs: tuple, source: tuple, layouts: list) -> bool:
    """Every input buffer is still the buffer it was (`layouts`) and holds exactly the values of
    `source`."""
    if [_layout(t) for t in inputs] != layouts:
        return False
    return all(a.equal(b) for a, b in zip(inputs, source, strict=True))


def _classify(exc: BaseException, where: str, reason):
    if isinstance(exc, _TimedOutputWrong):
        return exc.why
    if isinstance(exc, _InputsModified):
        return reason("inputs-modified", f"{where}: {exc}"[:500])
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return reason("out-of-memory", f"{where}: {type(exc).__name__}: {exc}"[:500])
    return reason("crash", f"{where}: {type(exc).__name__}: {exc}"[:500])


# ---------------------------------------------------------------------------------------------
# timing


def _time_body(ctx: Context, runners: list[Runner], excluded, chan: Channel) -> dict:
    from baselines import roofline

    _prepare_device(ctx)
    gc.disable()  # collections happen after blocks, under their marks (see _marked)
    ctx.state = global_state.snapshot(ctx.torch, _task_names(ctx))
    timer, ceilings, reads = None, None, None  # measured before any candidate loads
    if ctx.device == "cuda":
        timer = ctx.timing.GpuTimer(ctx.device)
        floor = ctx.request.get("floor") or {}
        bandwidth = floor.get("copy_bytes_per_s") or roofline.device_copy_bandwidth(timer)
        ceilings = roofline.Ceilings(bandwidth, floor.get("flops_per_s"))
        if ctx.task.declares_read_write():
            read_bw = floor.get("read_bytes_per_s") or roofline.device_read_bandwidth(timer)
            reads = roofline.Ceilings(max(read_bw, bandwidth), floor.get("flops_per_s"))
    runners = _load_runners(ctx, runners, chan)
    rule = ctx.timing.StoppingRule(**ctx.request.get("rule", {}))
    sampler = _telemetry_sampler(ctx) if ctx.device == "cuda" else None
    with sampler or contextlib.nullcontext():
        for shape in ctx.shapes:
            live = [
                r
                for r in runners
                if r.ok and not r.dropped(shape.name) and (r.label, shape.name) not in excluded
            ]
            if live:
                _time_shape(ctx, shape, live, rule, timer, (ceilings, reads), chan, sampler)
                gc.collect()  # what the shape's captures and closures left, before the next
    _tamper_check(ctx, runners)
    extra = None
    if ceilings is not None:
        extra = {**ceilings.__dict__, "read_bytes_per_s": reads.copy_bytes_per_s if reads else None}
    return {**_wire(runners), "extra": extra}


def _telemetry_sampler(ctx: Context):
    """An NVML sampler for the GPU being timed, or None where NVML or the device is missing
    (telemetry only reports; its absence never stops a measurement)."""
    try:
        from baselines.telemetry import TelemetrySampler, nvml_index_of
        from host_tuning.nvml import open_nvml

        backend = open_nvml()
        if backend is None:
            return None
        index = nvml_index_of(backend, ctx.torch.cuda.current_device())
        return None if index is None else TelemetrySampler(backend, index)
    except Exception:
        return None


def _floor_s(task, shape, ceilings: tuple) -> float:
    """Bytes at copy bandwidth; for a task that declares reads and writes apart, all of its bytes
    at the higher of read and copy bandwidth (a read-mostly kernel can beat copy bandwidth)."""
    copy, reads = ceilings
    if copy is None:
        return 0.0
    if reads is not None:
        read, written = task.bytes_read_written(shape)
        return reads.floor_s(read + written, task.flops(shape))
    return copy.floor_s(task.bytes_moved(shape), task.flops(shape))


def capture_count(output_bytes: int, held_bytes: int, slots: int) -> int:
    """How many captures a runner gets at a shape: `slots`, fewer where one capture holds more
    than CAPTURE_BYTES / slots (outputs, or everything in its graph's pool), and at least one."""
    return max(1, min(slots, CAPTURE_BYTES // max(output_bytes, held_bytes, 1)))


def _value_sets(ctx: Context, shape, count: int, salt: int) -> list[tuple]:
    return [
        ctx.task.make_inputs(shape, _mix(ctx.secret, shape.seed, salt + i), ctx.device)
        for i in range(count)
    ]


def _time_shape(
    ctx: Context, shape, live: list[Runner], rule, timer, ceilings, chan, sampler=None
) -> None:
    """Every runner reads the same input buffers (so no runner gains from where its inputs
    landed), timed interleaved; new values go into those buffers between samples (CPU) or
    blocks (GPU), outside the timed region. Afterwards each candidate's timed path runs again on
    perturbed and on new values in those buffers and is checked again."""
    torch, timing, device = ctx.torch, ctx.timing, ctx.device
    # No value set is ever used twice: a cache keyed on the inputs' whole contents (a checksum,
    # cheap next to a compute-bound kernel) never hits.
    current = list(_value_sets(ctx, shape, 1, FRESH_SALT))
    inputs = tuple(t.clone() for t in current[0])
    layouts = [_layout(t) for t in inputs]
    turn = [0]

    def rotate() -> None:
        turn[0] += 1
        current[0] = _value_sets(ctx, shape, 1, FRESH_SALT + turn[0])[0]
        for buf, new in zip(inputs, current[0], strict=True):
            buf.copy_(new)

    def untouched(runner: Runner, doing: str = "timed calls") -> None:
        """After a block or a capture: the buffers are still the buffers, holding the values put
        in (a candidate that writes an input it has an answer for, and answers from memory,
        would be timed doing nothing), and a candidate left global torch state as it was (a
        peer's change is only set back)."""
        left = _state_left(ctx)
        if left and runner.kind == "candidate":
            raise _TimedOutputWrong(ctx.reason("forbidden-call", f"{shape.name}: {doing} {left}"))
        if not _unchanged(inputs, current[0], layouts):
            raise _InputsModified(f"an input changed during {doing}")

    def bind(runner: Runner):
        """(block(n) -> samples, replay() -> each capture's timed outputs) for `runner`, or None
        where it could not be set up (it is dropped from the shape, with why). Its captures live
        in these closures only."""
        try:
            if device == "cuda":
                # Several captures, one per block in turn: where one capture's outputs landed
                # can move its time by tenths of a percent for as long as it lives. Fewer when
                # a capture holds much memory: large outputs (their placement averages out
                # within one capture anyway), or a peer's intermediates in its graph's pool.
                graph, out, held = timer.capture_held(lambda r=runner: _call(r, inputs))
                slots = [(graph, out)]
                outputs = sum(t.numel() * t.element_size() for t in _as_tuple(out))
                # A candidate's pool does not count: it could allocate scratch it never uses
                # to opt out of the averaging over captures.
                pool = held if runner.kind != "candidate" else 0
                wanted = capture_count(outputs, pool, timing.CAPTURE_SLOTS)
                slots += [
                    timer.capture(lambda r=runner: _call(r, inputs)) for _ in range(wanted - 1)
                ]
                runner.shapes.setdefault(shape.name, {})["captures"] = len(slots)
                timed = timer.rotating([graph for graph, _ in slots])
                # A capture runs the runner's Python (a compiled peer compiles here): what it
                # changed is its own, not that of whichever runner's block is checked first.
                untouched(runner, "its capture")

                def block(n, timed=timed, r=runner):
                    rotate()
                    samples = timed(n)
                    untouched(r)
                    return samples

                def replay(slots=slots):
                    # Every capture is checked on its own, its outputs poisoned first: captures
                    # that share one output buffer cannot pass on another capture's answer.
                    got = []
                    for graph, out in slots:
                        _poison_outputs(out, inputs)
                        graph.replay()
                        torch.cuda.synchronize()
                        got.append(tuple(t.clone() for t in _as_tuple(out)))
                    return got

                return block, replay

            def block(n, r=runner):
                samples = []
                for _ in range(n):
                    rotate()
                    got: list = []
                    samples += timing.cpu_block(lambda g=got: g.append(_call(r, inputs)), 1)
                    untouched(r)
                    if r.kind == "candidate":
                        _check_timed_output(ctx, shape, got[0], current[0])
                return samples

            def replay(r=runner):
                return [tuple(t.clone() for t in _as_tuple(_call(r, inputs)))]

            return block, replay

        except timing.CaptureError as exc:
            runner.drop(
                shape.name, ctx.reason("graph-capture-failed", f"{shape.name}: {exc}"[:500])
            )
            return None
        except BaseException as exc:
            runner.drop(shape.name, _classify(exc, shape.name, ctx.reason))
            return None

    bound = []  # (runner, block, replay)
    for runner in live:
        chan.mark(runner.label, shape.name)
        pair = bind(runner)
        if pair is not None:
            block, replay = pair
            bound.append(
                (runner, _marked(chan, runner.label, shape.name, block, len(bound)), replay)
            )
    if not bound:
        return
    while True:
        log: list = []
        hook = None
        if sampler is not None:
            from baselines.telemetry import clean_block_hook

            hook = clean_block_hook(sampler, log, label=shape.name)
        try:
            medians = timing.run_interleaved([b[1] for b in bound], rule, on_block=hook)
            break
        except _BlockFailed as failed:  # that runner is out; the others are timed again
            if _device_fault(failed.error):
                raise failed.error from None  # may be another's (see _device_fault)
            runner = bound.pop(failed.index)[0]
            runner.drop(shape.name, _classify(failed.error, shape.name, ctx.reason))
            if not bound:
                return
            bound = [
                (r, _marked(chan, r.label, shape.name, b.inner, i), p)
                for i, (r, b, p) in enumerate(bound)
            ]
    current.clear()  # free the last value set before the re-verification draws its own
    floor = _floor_s(ctx.task, shape, ceilings)
    checked = []
    for i, (timed_runner, blocks) in enumerate(zip(bound, medians, strict=True)):
        runner = timed_runner[0]
        entry = runner.shapes.setdefault(shape.name, {})
        entry.update(
            blocks_s=blocks,
            n_samples=len(blocks) * rule.samples_per_block,
            method="cuda-graph" if device == "cuda" else "host-clock",
        )
        if sampler is not None:
            from baselines.telemetry import summarize_records

            entry["telemetry"] = summarize_records([r for r in log if r.runner == i])
        if runner.kind != "candidate":
            continue
        if min(blocks) < floor:
            runner.reasons.append(
                ctx.reason(
                    "faster-than-physics",
                    f"{shape.name}: {min(blocks) * 1e6:.2f} us is under the floor of "
                    f"{floor * 1e6:.2f} us",
                )
            )
            continue
        checked.append((runner, timed_runner[2]))
    # The peers' captures (and their pools) go before the re-verification draws its reference:
    # `checked` is the only holder of a capture left.
    del bound, timed_runner, pair, block, replay
    if device == "cuda":
        torch.cuda.empty_cache()
    if checked:
        _reverify(ctx, shape, inputs, checked, chan)


def _task_names(ctx: Context) -> tuple[str, ...]:
    """The torch functions the task's module calls (its reference and peers)."""
    path = Path(ctx.task.folder) / "task.py"
    return global_state.task_torch_names(path.read_text()) if path.exists() else ()


def _state_left(ctx: Context) -> str | None:
    """How a candidate's code changed global torch state since the child's snapshot, in words
    ("left a torch function mode active"), with what can be set back set back; or None."""
    return global_state.changed(ctx.torch, ctx.state)


class _TimedOutputWrong(Exception):
    """A timed call's output failed its check (the reason says how)."""

    def __init__(self, why) -> None:
        super().__init__(why.message)
        self.why = why


def _check_timed_output(ctx: Context, shape, out, values: tuple) -> None:
    """On the CPU, where nothing replays a capture: every timed output must be a plain tensor,
    and a secretly drawn share of them (`TIMED_CHECK_SHARE`) is checked against the reference
    of the values that call was given, so a candidate that answers from memory in timed calls
    and works only when re-verified (which it might tell apart) is caught while it is timed."""
    torch = ctx.torch
    outputs = _as_tuple(out)
    if any(type(t) is not torch.Tensor for t in outputs):
        kinds = ", ".join(type(t).__name__ for t in outputs)
        raise _TimedOutputWrong(
            ctx.reason("wrong-output-type", f"{shape.name}: a timed call returned {kinds}")
        )
    if _DRAW.random() >= TIMED_CHECK_SHARE:
        return
    why, _ = _check_outputs(ctx, shape, out, _reference(ctx.task, values, torch))
    if why is not None:
        raise _TimedOutputWrong(
            ctx.reason("reverify-mismatch", f"during timing: {why.message}"[:500])
        )


_DEVICE_FAULTS = (
    "CUDA error",
    "cudaError",
    "CUDA_ERROR",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
)


def _device_fault(exc: BaseException) -> bool:
    """A GPU fault is reported asynchronously, at the next synchronisation: in whichever
    runner's block comes after the kernel that caused it, and the context stays broken. The
    child is given up (the exception leaves it), so that `_supervised` decides who could have
    caused it, as for a crash."""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ == "AcceleratorError" or any(f in text for f in _DEVICE_FAULTS)


class _BlockFailed(Exception):
    """A runner's block raised: which runner, and what."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


def _collect_young() -> None:
    """Collect the young generation until nothing is left to collect: a finalizer that re-arms
    itself (leaving new garbage each time it runs) must run out here, under the current mark,
    not be left for the collection after the next runner's block."""
    for _ in range(20):
        if gc.collect(0) == 0:
            return
    raise RuntimeError("finalizers kept leaving new garbage after the block (re-arming)")


def _marked(chan: Channel, label: str, shape: str, block, index: int):
    """`block` with a progress mark before it, and its failure tagged with the runner's index.
    The timing child runs with the cyclic garbage collector off, and collects the young
    generation after each block, under that block's mark: a finalizer left by a candidate runs
    there, never inside another runner's block where its crash or stall would be blamed on
    that runner."""

    def run(n: int) -> list[float]:
        chan.mark(label, shape)
        try:
            samples = block(n)
            _collect_young()
            return samples
        except BaseException as exc:
            raise _BlockFailed(index, exc) from exc

    run.inner = block
    return run


def _perturbed(ctx: Context, shape, current: tuple, fraction: float, salt: int) -> tuple:
    """`current` with about `fraction` of each floating input's elements (and at least one of the
    first that the draw changes) replaced by values from a fresh draw: a cache keyed on a few
    sampled values hits while the answer has changed."""
    torch = ctx.torch
    fresh = _value_sets(ctx, shape, 1, salt)[0]
    gen = torch.Generator(device=ctx.device).manual_seed(_mix(ctx.secret, shape.seed, salt + 1))
    out, forced = [], False
    for cur, new in zip(current, fresh, strict=True):
        if not cur.is_floating_point() or cur.numel() == 0:
            out.append(cur.clone())
            continue
        mask = torch.rand(cur.shape, generator=gen, device=cur.device) < fraction
        if not forced:
            # One element the fresh draw changes (a padding row may be zero in both), found by
            # random tries: an index of all changed elements would take 8 bytes an element.
            picks = torch.randint(0, cur.numel(), (64,), generator=gen, device=cur.device)
            moved = new.reshape(-1)[picks] != cur.reshape(-1)[picks]
            if bool(moved.any()):
                mask.view(-1)[picks[moved.int().argmax()]] = True
                forced = True
        out.append(torch.where(mask, new, cur))
    return tuple(out)


def _reverify(ctx: Context, shape, inputs: tuple, checked: list, chan: Channel) -> None:
    """The timed path of each candidate once more: on the last timed values (which every
    candidate then has seen, whichever runner's block came last), then on those values with a
    few elements changed, then on wholly new values, all in the same buffers; every candidate's
    output is final before the reference of those values is computed."""
    torch = ctx.torch
    layouts = [_layout(t) for t in inputs]
    rounds = [("last timed", None)]
    rounds += [("perturbed", f) for f in PERTURB_FRACTIONS] + [("new", None)]
    for i, (kind, fraction) in enumerate(rounds):
        salt = 99 + 2 * i
        if kind == "last timed":
            values = tuple(t.clone() for t in inputs)
        elif kind == "new":
            values = _value_sets(ctx, shape, 1, salt)[0]
        else:
            values = _perturbed(ctx, shape, inputs, fraction, salt)
        for buf, new in zip(inputs, values, strict=True):
            buf.copy_(new)
        outputs = []
        for runner, replay in checked:
            if not runner.ok:
                outputs.append(None)
                continue
            chan.mark(runner.label, shape.name)
            try:
                outputs.append(replay())
                _collect_young()
                left = _state_left(ctx)
                if left:
                    raise _TimedOutputWrong(
                        ctx.reason("forbidden-call", f"{shape.name}: re-verifying {left}")
                    )
                if not _unchanged(inputs, values, layouts):
                    raise _InputsModified(f"an input changed while re-verifying ({kind} values)")
            except BaseException as exc:
                if _device_fault(exc):
                    raise
                runner.reasons.append(_classify(exc, shape.name, ctx.reason))
                outputs.append(None)
                for buf, new in zip(inputs, values, strict=True):
                    buf.copy_(new)
        if all(o is None for o in outputs):
            return
        # From the harness's own copy: the buffers the candidates saw are theirs to spoil.
        refs = _reference(ctx.task, values, torch)
        del values
        for (runner, _), captures in zip(checked, outputs, strict=True):
            if captures is None or not runner.ok:
                continue
            for got in captures:
                why, _ = _check_outputs(ctx, shape, got, refs)
                if why is not None:
                    runner.reasons.append(
                        ctx.reason(
                            "reverify-mismatch", f"after timing, {kind} values: {why.message}"
                        )
                    )
                    break
        del refs, outputs

"""Process-wide torch state that a candidate must leave as it found it: a snapshot taken in a
worker child before any candidate loads, and a check after each import, call, timed block and
re-verification that says what changed and puts back what can be put back.

A torch function or dispatch mode left on its stack sees every later torch call: the harness's
own reference and error norms (which it can make lie) and the other runners' calls (which it
can slow). A profiler left recording slows every later call. Grad, inference and autocast modes, the default dtype, precision and determinism
flags and the thread count change what the reference computes and how fast the peers run. The
static guards ban the usual ways to change them; this catches the ways they miss (a context
entered by a generator that is never closed, say). The harness's own functions, and the names
in torch's namespaces that its checks call, must still be bound to the same objects.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import json
import random
import sys
import warnings
from collections.abc import Callable
from typing import Any

WARNING_FILTERS = "the warning filters"


def _warning_filters() -> tuple:
    return (warnings.defaultaction, tuple(warnings.filters))


def _set_warning_filters(state: tuple) -> None:
    warnings.defaultaction = state[0]
    warnings.filters[:] = list(state[1])
    warnings._filters_mutated()  # the module's own cache of filter decisions


def _plain_filter(entry: object) -> bool:
    """A filter as `warnings.filterwarnings` makes it: a 5-tuple whose action is an exact str
    (a str subclass can compare unequal to "error" here and equal in the C code)."""
    return type(entry) is tuple and len(entry) == 5 and type(entry[0]) is str


def _raises_warnings(before: tuple, now: tuple) -> bool:
    """Whether the filters `now` can turn a warning into an exception where `before` could not:
    an "error" filter or default action that is new, or an entry that is not a plain filter."""
    if type(now[0]) is not str or (now[0] == "error" and before[0] != "error"):
        return True
    return any(not _plain_filter(f) or (f[0] == "error" and f not in before[1]) for f in now[1])


def _items(torch) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]]:
    """name -> (read it, set it back); None where it cannot be set back from outside."""
    c = torch._C

    def pop_to(depth: int, length: Callable[[], int], pop: Callable[[], Any]) -> None:
        while length() > depth:
            pop()

    def matmul_tf32(value: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = value

    def cudnn_tf32(value: bool) -> None:
        torch.backends.cudnn.allow_tf32 = value

    return {
        "a torch function mode": (
            c._len_torch_function_stack,
            lambda d: pop_to(d, c._len_torch_function_stack, c._pop_torch_function_stack),
        ),
        "a torch dispatch mode": (
            c._len_torch_dispatch_stack,
            lambda d: pop_to(
                d, c._len_torch_dispatch_stack, lambda: c._pop_torch_dispatch_stack(None)
            ),
        ),
        # a profiler left recording slows every later torch call (cannot be stopped from here)
        "the autograd profiler": (c._autograd._profiler_enabled, None),
        # warnings.simplefilter("error") would turn a rival's or the harness's warnings into
        # exceptions raised inside their code, and "always" would slow a rival that warns. Every
        # change is set back; only one that can raise is reported (libraries add "ignore"
        # filters when they load lazily).
        WARNING_FILTERS: (_warning_filters, _set_warning_filters),
        "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
        "inference mode": (torch.is_inference_mode_enabled, None),
        "CPU autocast": (
            lambda: torch.is_autocast_enabled("cpu"),
            lambda v: torch.set_autocast_enabled("cpu", v),
        ),
        "CUDA autocast": (
            lambda: torch.is_autocast_enabled("cuda"),
            lambda v: torch.set_autocast_enabled("cuda", v),
        ),
        "the default dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "deterministic algorithms": (
            torch.are_deterministic_algorithms_enabled,
            torch.use_deterministic_algorithms,
        ),
        "the thread count": (torch.get_num_threads, torch.set_num_threads),
        "float32 matmul precision": (
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        "TF32 in matmuls": (lambda: torch.backends.cuda.matmul.allow_tf32, matmul_tf32),
        "TF32 in cuDNN": (lambda: torch.backends.cudnn.allow_tf32, cudnn_tf32),
    }


# The harness's own code, and torch's namespaces that its checks call into: every name bound
# there must still be bound to the same object (an exec that got past the static guards would
# rebind the output check or the clock).
HARNESS_MODULES = (
    "loop.worker",
    "loop.worker_child",
    "loop.global_state",
    "loop.reasons",
    "baselines.timer",
    "baselines.stats",
)
HARNESS_KEY = "the harness's code"
# Modules that gain no names after they load: a name added to one shadows a builtin its code
# calls (enum.global_enum can add `float` to loop.worker).
FIXED_MODULES = (
    *HARNESS_MODULES,
    "builtins",
    "json",
    "json.encoder",
    "hashlib",
    "random",
    "warnings",
)
# What Python itself writes into a module's globals: warnings.warn(stacklevel=2) from a
# candidate's call records itself in its caller's (the harness's) registry.
PYTHON_OWN_KEYS = {"__warningregistry__"}
TORCH_CHECKED = ("isfinite", "empty", "equal", "where", "rand", "randint", "full", "float64")


TASK_NAMES_KEY = "the task's torch functions"
# names torch rebinds itself (importing torch._dynamo wraps manual_seed)
TORCH_SELF_REBOUND = {"torch.manual_seed"}


def _resolve(torch, dotted: str) -> Any:
    obj = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _task_spaces(torch, names: tuple[str, ...]) -> list[tuple[str, Any, dict]]:
    """The torch functions the task's reference and peers call (`torch.rsqrt`): rebinding one
    makes the reference agree with a wrong kernel, or slows the peers."""
    out = []
    for dotted in names:
        owner_path, _, name = dotted.rpartition(".")
        try:
            owner = _resolve(torch, owner_path)
            out.append((owner_path, owner, {name: getattr(owner, name)}))
        except AttributeError:
            continue
    return out


def _namespaces(torch, task_names: tuple[str, ...] = ()) -> list[tuple[str, Any, dict]]:
    """(label, owner, namespace): a module (its dict is written back), a class (set and deleted
    as attributes: a new name on it shadows what it inherits), or torch (only the names the
    output checks call: torch itself rebinds others, such as torch.Storage)."""
    out: list[tuple[str, Any, dict]] = [
        (name, None, vars(sys.modules[name])) for name in HARNESS_MODULES if name in sys.modules
    ]
    # a name added to builtins (enum's _convert_ can add `float`) shadows it everywhere
    out.append(("builtins", None, vars(builtins)))
    checked = {k: getattr(torch, k) for k in TORCH_CHECKED if hasattr(torch, k)}
    out += [
        ("torch", torch, checked),
        ("torch.linalg", None, vars(torch.linalg)),
        ("torch.Tensor", torch.Tensor, torch.Tensor.__dict__),
        # the child's own plumbing: results are JSON, value sets are hashed, checks drawn
        ("json", None, vars(json)),
        ("json.encoder", None, vars(json.encoder)),
        ("json.JSONEncoder", json.JSONEncoder, json.JSONEncoder.__dict__),
        ("hashlib", None, vars(hashlib)),
        ("random", None, vars(random)),
        ("random.Random", random.Random, random.Random.__dict__),
        # how warnings are shown and filtered (the filter list itself is checked by value)
        ("warnings", None, vars(warnings)),
        ("random.SystemRandom", random.SystemRandom, random.SystemRandom.__dict__),
    ]
    return out + _task_spaces(torch, task_names)


def snapshot(torch, task_names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The state now; `task_names` are the task's torch functions (see `task_torch_names`)."""
    state: dict[str, Any] = {name: read() for name, (read, _) in _items(torch).items()}
    names = tuple(n for n in task_names if n not in TORCH_SELF_REBOUND)
    state[TASK_NAMES_KEY] = names
    state[HARNESS_KEY] = {
        (label, key): value
        for label, _, space in _namespaces(torch, names)
        for key, value in space.items()
    }
    return state


def task_torch_names(source: str) -> tuple[str, ...]:
    """The `torch.x.y` functions a task module's source calls (through `import torch` or
    `import torch.nn.functional as F`), as dotted names."""
    tree = ast.parse(source)
    roots = {"torch": "torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch" and a.asname:
                    roots[a.asname] = a.name
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if (
                isinstance(cur, ast.Name)
                and cur.id in roots
                and not any(p.startswith("_") for p in parts)
            ):
                found.add(".".join([roots[cur.id], *reversed(parts)]))
    return tuple(sorted(found))


def _rebound(torch, before: dict, task_names: tuple[str, ...]) -> str | None:
    """The first name of the harness (or of a watched namespace) bound to another object than
    in `before`, after binding every such name back. Names added since are left alone on a
    module (modules load lazily) and removed from a class."""
    first = None
    for label, owner, space in _namespaces(torch, task_names):
        is_class = isinstance(owner, type)
        for key in list(space):
            if key in PYTHON_OWN_KEYS:
                continue
            if (label, key) not in before:
                if is_class:
                    first = first or f"{label}.{key}"
                    delattr(owner, key)
                elif label in FIXED_MODULES:
                    first = first or f"{label}.{key}"
                    del space[key]
                continue
            was = before[(label, key)]
            if space[key] is not was:
                first = first or f"{label}.{key}"
                if owner is not None:
                    with contextlib.suppress(AttributeError, TypeError):  # read-only: reported
                        setattr(owner, key, was)
                else:
                    space[key] = was
    return first


def changed(torch, before: dict[str, Any]) -> str | None:
    """What differs from `before` (the first item, in words), after setting back everything that
    can be set back; None when nothing does."""
    found = []
    if HARNESS_KEY in before:
        name = _rebound(torch, before[HARNESS_KEY], before[TASK_NAMES_KEY])
        if name is not None:
            found.append(f"rebound {name}")
    for name, (read, put_back) in _items(torch).items():
        now = read()
        if name not in before or now == before[name]:
            continue
        if name == WARNING_FILTERS and not _raises_warnings(before[name], now):
            put_back(before[name])
            continue
        if name.startswith("a torch"):
            found.append(f"left {name} active")
        else:
            values = f" ({before[name]} to {now})" if len(f"{before[name]}{now}") < 60 else ""
            found.append(f"changed {name}{values}")
        if put_back is not None:
            put_back(before[name])
    return found[0] if found else None

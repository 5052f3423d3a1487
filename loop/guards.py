"""Static checks of a candidate's source, from its syntax tree.

What a candidate may import and call, that it assigns no attribute of a module it did not define,
that its declared LANGUAGE does the work, and that it does not call the task's reference, its
peers or a library op that implements the task.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from loop.reasons import Reason, reason

LANGUAGES = ("triton", "cuda", "cupy", "torch")

ALLOWED_MODULES = {
    "__future__",
    "torch",
    "triton",
    "cupy",
    "numpy",
    "math",
    "functools",
    "itertools",
    "typing",
    "dataclasses",
    "enum",
}

FORBIDDEN_NAMES = {
    "open": "file I/O",
    "exec": "dynamic code",
    "eval": "dynamic code",
    "compile": "dynamic code",
    "__import__": "dynamic import",
    "getattr": "dynamic attribute access",
    "setattr": "dynamic attribute assignment",
    "delattr": "dynamic attribute deletion",
    "globals": "access to the harness's globals",
    "locals": "frame access",
    "vars": "namespace access",
    "breakpoint": "debugger",
    "input": "reading input",
    "exit": "ending the worker",
    "quit": "ending the worker",
    "memoryview": "raw memory access",
}

FORBIDDEN_ATTRIBUTES = {
    "Stream": "creating a stream",
    "ExternalStream": "creating a stream",
    "stream": "switching streams",
    "set_stream": "switching streams",
    "Event": "creating events (the timer is the harness's)",
    "synchronize": "a host synchronisation inside the kernel",
    "CUDAGraph": "capturing its own graph",
    "graph": "capturing its own graph",
    "compile": "torch.compile is a peer, not a kernel",
    "ops": "calling library operators directly",
    "_getframe": "frame access",
    "f_back": "frame access",
    "f_globals": "frame access",
    "f_locals": "frame access",
    "gi_frame": "frame access",
    "__globals__": "access to another function's globals",
    "__code__": "code object access",
    "__closure__": "closure access",
    "__builtins__": "builtins access",
    "__dict__": "namespace access",
    "__subclasses__": "object graph walking",
    "__bases__": "object graph walking",
    "__mro__": "object graph walking",
    "__class__": "object graph walking",
    "get_referrers": "object graph walking",
    "get_objects": "object graph walking",
    "environ": "environment reads",
    "getenv": "environment reads",
    "cudart": "raw CUDA runtime access",
    "from_blob": "raw memory access",
    "set_per_process_memory_fraction": "changing the harness's memory limits",
    "manual_seed": "reseeding the harness's generators",
    "set_rng_state": "reseeding the harness's generators",
    "get_rng_state": "reading the harness's generator state",
    "initial_seed": "reading the harness's seed",
    "seed": "reading the harness's seed",
    "allow_tf32": "changing precision flags",
    "set_float32_matmul_precision": "changing precision flags",
    "use_deterministic_algorithms": "changing determinism flags",
    "sys": "reaching the interpreter's module table",
    "os": "reaching the operating system",
    "modules": "reaching loaded modules",
    "_exit": "ending the worker",
    "__setattr__": "dynamic attribute assignment",
    "__getattribute__": "dynamic attribute access",
    "__delattr__": "dynamic attribute deletion",
    "tb_frame": "frame access",
    "cudaStreamSetAttribute": "setting stream attributes (persisting L2 window)",
    "streamSetAttribute": "setting stream attributes (persisting L2 window)",
    "deviceSetLimit": "changing device limits (persisting L2 size)",
    "ctxResetPersistingL2Cache": "changing the harness's L2 state",
    "__traceback__": "frame access",
    # modules that allowed packages re-export as attributes (numpy.ctypeslib.ctypes,
    # torch.utils.cpp_extension.subprocess, triton.runtime.build.subprocess, ...)
    "ctypes": "raw memory and C calls",
    "ctypeslib": "raw memory and C calls",
    "pythonapi": "raw memory and C calls",
    "subprocess": "starting processes",
    "multiprocessing": "starting processes",
    "Process": "starting processes",
    "threading": "starting threads",
    "importlib": "dynamic import",
    "shutil": "file operations",
    # file I/O without open()
    "tofile": "file I/O",
    "fromfile": "file I/O",
    "memmap": "file I/O",
    "from_file": "file I/O",
    "save": "file I/O",
    "savez": "file I/O",
    "savetxt": "file I/O",
    "loadtxt": "file I/O",
    "genfromtxt": "file I/O",
    "sched_setaffinity": "changing the worker's CPUs",
    "setpriority": "changing the worker's priority",
    "set_num_threads": "changing the harness's thread count",
    "set_num_interop_threads": "changing the harness's thread count",
    "set_default_dtype": "changing the harness's defaults",
    "set_default_device": "changing the harness's defaults",
}

# `<module>.load` (numpy.load, torch.load) reads files and unpickles; `tl.load` is Triton's.
FILE_LOADERS = {"numpy", "torch"}


# cupy's raw CUDA runtime and driver bindings (persisting-L2 windows, device limits, stream
# attributes); triton.runtime is fine, so these are banned under cupy only.
CUPY_RAW = {"runtime", "driver"}


@dataclass(frozen=True)
class StaticReport:
    language: str | None
    reasons: list[Reason]


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _declared_language(tree: ast.Module) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "LANGUAGE" for t in node.targets
        ):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
            return None
    return None


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _language_evidence(tree: ast.Module, aliases: dict[str, str]) -> set[str]:
    """Which languages visibly do work in this file."""
    found: set[str] = set()
    jitted: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = _dotted(target)
                root = aliases.get(name.split(".")[0], name.split(".")[0])
                if root == "triton" or name.split(".")[-1] in {"jit", "autotune"}:
                    jitted.add(node.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Subscript) and _root_name(func.value) in jitted:
                found.add("triton")
            name = _dotted(func)
            last = name.split(".")[-1]
            root = aliases.get(name.split(".")[0], name.split(".")[0])
            if root == "cupy" and last in {
                "RawKernel",
                "RawModule",
                "ElementwiseKernel",
                "ReductionKernel",
            }:
                found.update({"cupy", "cuda"})
            if last == "load_inline":
                found.add("cuda")
    return found


def check_source(source: str, filename: str, forbidden_ops: tuple[str, ...] = ()) -> StaticReport:
    """All static reasons to reject `source`; an empty list means it may be loaded."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return StaticReport(None, [reason("syntax-error", f"{filename}:{exc.lineno}: {exc.msg}")])

    reasons: list[Reason] = []
    aliases: dict[str, str] = {}
    defined_here: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[(alias.asname or alias.name).split(".")[0]] = top
                if top not in ALLOWED_MODULES:
                    reasons.append(
                        reason("forbidden-import", f"line {node.lineno}: import {alias.name}")
                    )
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level or top not in ALLOWED_MODULES:
                reasons.append(
                    reason("forbidden-import", f"line {node.lineno}: from {node.module} import")
                )
            module_parts = set((node.module or "").split("."))
            for alias in node.names:
                aliases[alias.asname or alias.name] = top
                if top == "cupy" and (alias.name in CUPY_RAW or module_parts & CUPY_RAW):
                    reasons.append(
                        reason("forbidden-call", f"line {node.lineno}: cupy raw CUDA bindings")
                    )
                elif alias.name in forbidden_ops:
                    reasons.append(
                        reason("calls-reference", f"line {node.lineno}: imports {alias.name}")
                    )
                elif alias.name in FORBIDDEN_ATTRIBUTES:
                    reasons.append(
                        reason("forbidden-call", f"line {node.lineno}: imports {alias.name}")
                    )
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            defined_here.add(node.name)

    module_names = set(aliases) | _module_aliases(tree, set(aliases))
    parameters = _parameters(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            reasons.append(
                reason(
                    "forbidden-call",
                    f"line {node.lineno}: {node.id} ({FORBIDDEN_NAMES[node.id]})",
                )
            )
        elif isinstance(node, ast.Attribute):
            if node.attr in CUPY_RAW and aliases.get(_root_name(node) or "") == "cupy":
                reasons.append(
                    reason("forbidden-call", f"line {node.lineno}: {_dotted(node)} (raw CUDA)")
                )
            elif node.attr in FORBIDDEN_ATTRIBUTES:
                reasons.append(
                    reason(
                        "forbidden-call",
                        f"line {node.lineno}: .{node.attr} ({FORBIDDEN_ATTRIBUTES[node.attr]})",
                    )
                )
            elif (
                node.attr == "load"
                and isinstance(node.value, ast.Name)
                and aliases.get(node.value.id) in FILE_LOADERS
            ):
                reasons.append(
                    reason("forbidden-call", f"line {node.lineno}: {_dotted(node)} (file I/O)")
                )
            elif node.attr in forbidden_ops:
                reasons.append(
                    reason(
                        "calls-reference",
                        f"line {node.lineno}: .{node.attr} is a library op implementing the task",
                    )
                )
        elif isinstance(node, ast.Name) and node.id in forbidden_ops:
            reasons.append(
                reason("calls-reference", f"line {node.lineno}: {node.id} implements the task")
            )
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and _root_name(sub) in module_names | parameters:
                    reasons.append(
                        reason(
                            "foreign-attribute-assignment",
                            f"line {sub.lineno}: assigns {_dotted(sub)}",
                        )
                    )
        if (
            isinstance(node, ast.BinOp | ast.AugAssign)
            and isinstance(node.op, ast.MatMult)
            and "matmul" in forbidden_ops
        ):
            reasons.append(
                reason("calls-reference", f"line {node.lineno}: the @ operator is a matmul call")
            )
        if isinstance(node, ast.Global):
            reasons.append(reason("forbidden-call", f"line {node.lineno}: global statement"))

    if not any(
        (isinstance(n, ast.FunctionDef) and n.name == "kernel")
        or (
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "kernel" for t in n.targets)
        )
        for n in tree.body
    ):
        reasons.append(reason("no-kernel", "no top-level `kernel` function is defined"))
    language = _declared_language(tree)
    if language is None or language not in LANGUAGES:
        reasons.append(
            reason("bad-language", f"LANGUAGE = {language!r}; expected one of {LANGUAGES}")
        )
    elif language != "torch" and language not in _language_evidence(tree, aliases):
        reasons.append(
            reason(
                "language-not-used",
                f"LANGUAGE is {language!r} but no {language} kernel is launched in the file",
            )
        )
    return StaticReport(language, _dedupe(reasons))


def _module_aliases(tree: ast.Module, modules: set[str]) -> set[str]:
    """Names bound to a plain attribute chain of a module (`_lin = torch.linalg`), so that
    assigning to their attributes counts as assigning to the module's."""
    found = set(modules)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            value = getattr(node, "value", None)
            if not isinstance(node, ast.Assign | ast.AnnAssign) or value is None:
                continue
            chain = value
            while isinstance(chain, ast.Attribute):
                chain = chain.value
            if not (isinstance(chain, ast.Name) and chain.id in found):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name) and sub.id not in found:
                        found.add(sub.id)
                        changed = True
    return found - modules


def _parameters(tree: ast.Module) -> set[str]:
    """Parameter names of the candidate's functions (a module can be passed in as one), less
    `self` and `cls` of its own classes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if arg is not None:
                    names.add(arg.arg)
    return names - {"self", "cls"}


def _dedupe(reasons: list[Reason]) -> list[Reason]:
    seen: set[tuple[str, str]] = set()
    out = []
    for r in reasons:
        if (r.code, r.message) not in seen:
            seen.add((r.code, r.message))
            out.append(r)
    return out

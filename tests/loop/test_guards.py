"""Static checks read the syntax tree: what a candidate imports, calls and assigns."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.guards import check_source
from loop.tasks import kernels_root

HEADER = "import torch\nLANGUAGE = 'torch'\n"


def codes(source: str, forbidden_ops=()) -> set[str]:
    return {r.code for r in check_source(source, "cand.py", forbidden_ops).reasons}


SHIPPED = sorted(p for p in kernels_root().glob("*/*.py") if p.name != "task.py")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_candidates_pass(path: Path) -> None:
    ops = ("rms_norm", "layer_norm")
    assert check_source(path.read_text(), str(path), ops).reasons == []


@pytest.mark.parametrize(
    "line",
    [
        "import threading",
        "import os",
        "from subprocess import run",
        "import gc",
        "import inspect",
        "import ctypes",
        "import socket",
        "from . import something",
    ],
)
def test_forbidden_imports(line: str) -> None:
    assert "forbidden-import" in codes(f"{line}\n{HEADER}def kernel(x):\n    return x\n")


@pytest.mark.parametrize(
    "body",
    [
        "s = torch.cuda.Stream()",
        "open('/tmp/x').read()",
        "f = getattr(torch, 'zeros')",
        "g = globals()",
        "e = torch.cuda.Event()",
        "torch.cuda.synchronize()",
        "c = torch.compile(lambda t: t)",
        "v = x.__class__.__mro__",
    ],
)
def test_forbidden_calls(body: str) -> None:
    source = f"{HEADER}def kernel(x):\n    {body}\n    return x\n"
    assert "forbidden-call" in codes(source)


def test_assigning_attributes_of_imported_modules_is_caught() -> None:
    source = f"{HEADER}torch.cuda.Event = object\ndef kernel(x):\n    return x\n"
    assert "foreign-attribute-assignment" in codes(source)


def test_assigning_attributes_of_own_objects_is_fine() -> None:
    source = (
        f"{HEADER}class Box:\n    pass\nb = Box()\nb.value = 3\ndef kernel(x):\n    return x * 1\n"
    )
    assert codes(source) == set()


def test_declared_triton_without_a_launch_is_caught() -> None:
    source = "import torch\nLANGUAGE = 'triton'\ndef kernel(x):\n    return x * 2\n"
    assert "language-not-used" in codes(source)


def test_library_op_implementing_the_task_is_caught() -> None:
    source = f"{HEADER}def kernel(x, w):\n    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w)\n"
    assert "calls-reference" in codes(source, ("rms_norm",))


def test_missing_language_and_kernel() -> None:
    assert codes("import torch\n") >= {"bad-language", "no-kernel"}


def test_syntax_error_names_the_line() -> None:
    report = check_source("def kernel(:\n", "cand.py")
    assert [r.code for r in report.reasons] == ["syntax-error"]
    assert "cand.py:1" in report.reasons[0].message


def test_the_matmul_operator_is_a_matmul_call() -> None:
    ops = ("matmul", "mm")
    assert "calls-reference" in codes(HEADER + "def kernel(x, w):\n    return x @ w\n", ops)
    assert "calls-reference" in codes(HEADER + "def kernel(x, w):\n    x @= w\n    return x\n", ops)
    assert "calls-reference" not in codes(HEADER + "def kernel(x, w):\n    return x @ w\n")


@pytest.mark.parametrize(
    "line",
    [
        "import cupy\ncupy.cuda.runtime.deviceSetLimit(6, 1 << 20)",
        "import cupy as cp\ncp.cuda.driver.ctxSynchronize()",
        "from cupy.cuda import runtime",
        "from cupy.cuda.runtime import streamSetAttribute",
    ],
)
def test_cupy_raw_cuda_bindings_are_banned(line: str) -> None:
    assert "forbidden-call" in codes(HEADER + line + "\ndef kernel(x):\n    return x\n")


def test_triton_runtime_is_allowed() -> None:
    src = "import triton\nLANGUAGE = 'torch'\nN = triton.runtime.driver\ndef kernel(x):\n    return x\n"
    assert "forbidden-call" not in codes(src)

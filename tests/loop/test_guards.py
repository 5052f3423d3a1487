"""Static checks read the syntax tree: what a candidate imports, calls and assigns."""

from __future__ import annotations

import ast
import importlib
import types
import warnings
from pathlib import Path

import pytest

from loop.guards import ALLOWED_MODULES, FORBIDDEN_NAMES, PRIVATE_ALLOWED, check_source
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


def kernel_source(body: str, imports: str = "") -> str:
    return f"{imports}{HEADER}def kernel(x):\n    {body}\n    return x\n"


@pytest.mark.parametrize("name", sorted(FORBIDDEN_NAMES))
def test_forbidden_builtins_are_banned_as_attributes_too(name: str) -> None:
    assert "forbidden-call" in codes(kernel_source(f"f = x.{name}"))


@pytest.mark.parametrize(
    "body",
    [
        "b = torch.builtins.__import__('os')",
        "torch.builtins.setattr(torch, 'x', 1)",
        "f = torch.builtins.open('/etc/hostname')",
    ],
)
def test_builtins_through_the_torch_door(body: str) -> None:
    assert "forbidden-call" in codes(kernel_source(body))


@pytest.mark.parametrize(
    "chain",
    [
        "dataclasses.builtins",
        "enum.bltns",
        "typing.operator",
        "typing.collections._sys",
        "dataclasses._thread",
        "torch._jit_internal._thread",
        "triton.testing.gc",
        "torch.inspect",
        "dataclasses.inspect",
        "torch._utils.pickle",
        "triton.knobs.pathlib",
        "torch.typing_extensions.io",
        "torch._guards.unittest.mock",
        "torch.cuda.pynvml",
        "torch.utils._osp",
        "torch.utils.cpp_extension.setuptools",
        "torch.utils.cpp_extension.setuptools.distutils",
    ],
)
def test_modules_reexported_by_allowed_modules_are_banned(chain: str) -> None:
    imports = f"import {chain.split('.')[0]}\n"
    assert "forbidden-call" in codes(kernel_source(f"m = {chain}", imports))


@pytest.mark.parametrize(
    "body",
    [
        "y = numpy.array([1.0])",
        "y = torch.select(x, 0, 0)",
        "y = numpy.random.rand(3)",
        "y = math.sqrt(2.0)",
        "y = x.copy_(x)",
        "y = torch.jit.trace",
        "y = triton.language.math.rsqrt",
        "y = x.type(torch.float32)",
    ],
)
def test_honest_attributes_that_look_like_modules_pass(body: str) -> None:
    imports = "import math\nimport numpy\nimport triton\n"
    assert codes(kernel_source(body, imports)) == set()


# Capability-granting modules (threads, processes, files, frames, the interpreter, pickling,
# monkeypatching, GPU control): none may be reachable from an allowed module through an attribute
# name the guard lets through. Kept apart from the guard's own tables on purpose.
DANGEROUS = set(
    [
        "builtins",
        "_sitebuiltins",
        "sys",
        "os",
        "posix",
        "nt",
        "_thread",
        "threading",
        "gc",
        "inspect",
        "pickle",
        "_pickle",
        "marshal",
        "pathlib",
        "io",
        "_io",
        "socket",
        "_socket",
        "signal",
        "_signal",
        "operator",
        "_operator",
        "types",
        "weakref",
        "_weakref",
        "atexit",
        "faulthandler",
        "tempfile",
        "glob",
        "mmap",
        "resource",
        "runpy",
        "code",
        "codeop",
        "pkgutil",
        "linecache",
        "traceback",
        "tracemalloc",
        "asyncio",
        "_asyncio",
        "concurrent",
        "urllib",
        "http",
        "pty",
        "pdb",
        "bdb",
        "dis",
        "ctypes",
        "_ctypes",
        "subprocess",
        "_posixsubprocess",
        "multiprocessing",
        "_multiprocessing",
        "_posixshmem",
        "importlib",
        "_imp",
        "zipimport",
        "shutil",
        "copyreg",
        "platform",
        "zipfile",
        "tarfile",
        "gzip",
        "bz2",
        "lzma",
        "tokenize",
        "logging",
        "shelve",
        "dbm",
        "sqlite3",
        "site",
        "codecs",
        "unittest",
        "pytest",
        "_pytest",
        "pluggy",
        "pynvml",
        "fcntl",
        "termios",
        "ssl",
        "argparse",
        "timeit",
        "sqlalchemy",
        "alembic",
        "optuna",
        "grpc",
        "colorlog",
        "torchgen",
        "setuptools",
        "distutils",
        "pkg_resources",
        "_distutils_hack",
    ]
)


def module_doors(roots, dangerous: set[str]) -> dict[str, set[str]]:
    """Attribute name -> paths, for every module in `dangerous` reachable from `roots` through
    module attributes (not entering the dangerous ones). It walks what is imported at the time,
    so it sees more doors when the whole suite has run before it."""
    found: dict[str, set[str]] = {}
    for root in roots:
        try:
            module = importlib.import_module(root)
        except Exception:
            continue
        seen = {id(module)}
        frontier = [(root, module)]
        while frontier:
            following = []
            for path, mod in frontier:
                for name, value in list(vars(mod).items()):
                    # only a name that source can spell is a door (pytest's rewriting adds
                    # "@py_builtins" to the modules it rewrites; getattr is banned)
                    if not isinstance(value, types.ModuleType) or not name.isidentifier():
                        continue
                    if value.__name__.split(".")[0] in dangerous:
                        found.setdefault(name, set()).add(f"{path}.{name} -> {value.__name__}")
                    elif id(value) not in seen:
                        seen.add(id(value))
                        following.append((f"{path}.{name}", value))
            frontier = following
    return found


@pytest.fixture(scope="module")
def doors() -> dict[str, set[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # what a load_inline candidate imports (and, through it, setuptools), so that its doors
        # are walked whichever tests ran before this one in the process (modules imported
        # lazily by compilers may still add doors when other tests ran first)
        importlib.import_module("torch.utils.cpp_extension")
        return module_doors(sorted(ALLOWED_MODULES - {"__future__"}), DANGEROUS)


def test_the_door_walk_finds_doors(doors) -> None:
    assert {"builtins", "bltns", "_thread", "_sys", "gc", "inspect"} <= set(doors)


def test_no_dangerous_module_is_reachable_through_an_unbanned_attribute(doors) -> None:
    open_doors = {
        name: sorted(paths)[:3]
        for name, paths in doors.items()
        if "forbidden-call" not in codes(kernel_source(f"m = x.{name}"))
    }
    assert open_doors == {}


@pytest.mark.parametrize(
    "source",
    [
        "from torch.overrides import TorchFunctionMode\n",
        "import torch.utils._python_dispatch\n",
        "from torch.utils._python_dispatch import TorchDispatchMode\n",
        "from torch.library import Library\n",
    ],
)
def test_torch_mode_and_dispatcher_imports_are_banned(source: str) -> None:
    assert "forbidden-import" in codes(kernel_source("pass", source))


@pytest.mark.parametrize(
    "body",
    [
        "m = torch.overrides.TorchFunctionMode",
        "lib = torch.library.Library('aten', 'IMPL')",
        "f = torch.library.custom_op",
        "f = torch.library.register_fake",
        "f = torch.library.impl_abstract",
        "f = torch._library",
        "f = torch._C._disabled_torch_function_impl",
        "f = torch._C.DisableTorchFunction",
        "m = torch._subclasses.FakeTensorMode",
        "c = torch.device('meta').__enter__()",
        "f = torch.utils.weak",
        "f = x.finalize",
        "d = torch._dynamo",
    ],
)
def test_torch_hooks_are_banned(body: str) -> None:
    assert "forbidden-call" in codes(kernel_source(body))


@pytest.mark.parametrize("method", ["__torch_function__", "__torch_dispatch__", "__del__"])
def test_defining_hook_methods_is_banned(method: str) -> None:
    cls = f"class Hook:\n    def {method}(self, *args, **kwargs):\n        return None\n"
    assert "forbidden-call" in codes(cls + kernel_source("pass"))
    dynamic = f"Hook = type('Hook', (), {{'{method}': print}})\n"
    assert "forbidden-call" in codes(kernel_source("pass") + dynamic)


def test_honest_classes_and_contexts_pass() -> None:
    source = (
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "    def __call__(self, t):\n        return t * self.v\n"
        + HEADER
        + "def kernel(x):\n    with torch.no_grad():\n        return Box(2)(x)\n"
    )
    assert codes(source) == set()


NORMS = ("rms_norm", "layer_norm")


@pytest.mark.parametrize(
    "body",
    [
        "m = torch.nn.RMSNorm(8)",
        "m = torch.nn.modules.normalization.RMSNorm(8)",
        "m = torch.nn.LayerNorm(8)",
        "y = torch.nn.functional.rmsnorm",
    ],
)
def test_forbidden_ops_match_whatever_their_spelling(body: str) -> None:
    assert "calls-reference" in codes(kernel_source(body), NORMS)


def test_forbidden_ops_imported_under_another_spelling() -> None:
    source = kernel_source("m = Norm(8)", "from torch.nn import RMSNorm as Norm\n")
    assert "calls-reference" in codes(source, NORMS)


@pytest.mark.parametrize(
    "body", ["y = torch.bmm(x, x)", "y = torch.nn.functional.linear(x, x)", "y = x @ x"]
)
def test_library_gemm_forbids_every_library_matrix_product(body: str) -> None:
    """A task's FORBIDDEN_OPS may name "library-gemm" for loop.guards.LIBRARY_GEMM_OPS, the @
    operator (a matmul) included; with the other ops beside it."""
    assert "calls-reference" in codes(kernel_source(body), ("library-gemm",))
    assert "calls-reference" in codes(kernel_source(body), ("library-gemm", "rms_norm"))
    assert "calls-reference" not in codes(kernel_source(body), ("rms_norm",))


@pytest.mark.parametrize(
    ("body", "imports", "family"),
    [
        ("y = torch.nn.functional.conv1d(x, x)", "", "library-gemm"),
        ("y = torch.nn.functional.bilinear(x, x, x)", "", "library-gemm"),
        ("y = torch.nn.functional.grouped_mm(x, x)", "", "library-gemm"),
        ("y = torch.addbmm(x, x, x)", "", "library-gemm"),
        ("y = torch.nn.ConvTranspose1d(8, 8, 1)", "", "library-gemm"),
        ("y = torch.native_layer_norm(x, [8], None, None, 1e-6)", "", "library-norm"),
        ("y = torch.batch_norm_elemt(x)", "", "library-norm"),
        ("y = torch.nn.functional.local_response_norm(x, 8)", "", "library-norm"),
        ("y = torch.nn.Softmax2d()(x)", "", "library-softmax"),
        ("y = x.log_softmax(-1)", "", "library-softmax"),
        ("y = torch.distributions.Categorical(logits=x).probs", "", "library-softmax"),
        ("y = Cat(logits=x).probs", "from torch.distributions import Categorical as Cat\n",
         "library-softmax"),
        ("y = probs(x)", "from torch.distributions.utils import logits_to_probs as probs\n",
         "library-softmax"),
        ("y = attn(x, x, x)", "from torch.nn.attention.varlen import varlen_attn as attn\n",
         "library-attention"),
        ("y = torch.nn.functional.multi_head_attention_forward(x)", "", "library-attention"),
        ("y = torch.nn.TransformerDecoderLayer(8, 2)", "", "library-attention"),
        ("y = torch.nn.LazyConv1d(8, 1)", "", "library-gemm"),
        ("y = torch.nn.GRUCell(8, 8)", "", "library-gemm"),
        ("y = torch.vmap(torch.dot)", "", "library-gemm"),
        ("y = np.dot(x, x)", "import numpy as np\n", "library-gemm"),
        ("y = dot(x, x)", "from numpy import dot\n", "library-gemm"),
        ("y = x.renorm(2, 0, 1.0)", "", "library-norm"),
        ("y = torch.logcumsumexp(x, -1)", "", "library-softmax"),
    ],
)  # fmt: skip
def test_library_families_forbid_the_op_under_any_name(body, imports, family) -> None:
    """A family (loop.guards.LIBRARY_OPS) forbids its ops, and a library's longer names that
    hold one (native_layer_norm, Softmax2d); the ops of another family stay allowed."""
    assert "calls-reference" in codes(kernel_source(body, imports), (family,))
    others = tuple(f for f in ("library-gemm", "library-norm", "library-softmax") if f != family)
    if family != "library-attention":
        assert "calls-reference" not in codes(kernel_source(body, imports), others)


@pytest.mark.parametrize(
    "body",
    [
        # the candidate's own compiled extension, named for what it does
        "y = torch.utils.cpp_extension.load_inline('e', '').launch_rmsnorm_gemm(x)",
        "y = torch.cuda.current_stream().softmax_stream",
        "y = x.new_empty(3)",  # short ops match only themselves: `mm` is not in symmetric
        "y = torch.linalg.vector_norm(x)",
    ],
)
def test_library_families_leave_other_names_alone(body: str) -> None:
    families = ("library-gemm", "library-norm", "library-softmax", "library-attention")
    assert "calls-reference" not in codes(kernel_source(body), families)


def test_short_ops_match_only_themselves() -> None:
    source = kernel_source(
        "y = gl.DistributedLinearLayout", "from triton.experimental import gluon as gl\n"
    )
    assert "calls-reference" not in codes(source, ("library-gemm",))


def test_tritons_dot_is_the_kernels_own() -> None:
    """A dot product from torch, numpy or CuPy is a library product; Triton's is the kernel."""
    source = kernel_source("y = tl.dot(x, x)", "import triton.language as tl\n")
    assert "calls-reference" not in codes(source, ("library-gemm",))
    source = kernel_source("y = dot(x, x)", "from triton.language import dot\n")
    assert "calls-reference" not in codes(source, ("library-gemm",))


def test_own_functions_named_like_a_forbidden_op_pass() -> None:
    source = (
        HEADER + "def _rmsnorm_rows(x):\n    return x * 2\n"
        "def rms_norm(x):\n    return _rmsnorm_rows(x)\n"
        "class Norm:\n    def rms_norm(self, x):\n        return rms_norm(x)\n"
        "    def __call__(self, x):\n        return self.rms_norm(x)\n"
        "def kernel(x):\n    return Norm()(x)\n"
    )
    assert codes(source, NORMS) == set()


def test_own_function_names_do_not_shield_a_library_attribute() -> None:
    source = (
        HEADER + "def rms_norm(x):\n    return x\n"
        "def kernel(x, w):\n    f = [torch.nn.functional][0]\n"
        "    return f.rms_norm(x, (x.shape[-1],), w)\n"
    )
    assert "calls-reference" in codes(source, NORMS)


@pytest.mark.parametrize(
    "source",
    [
        kernel_source("h = typing.get_type_hints(kernel)", "import typing\n"),
        kernel_source("r = Ref('x')", "from typing import ForwardRef as Ref\n"),
        HEADER + "def f(t: \"torch.builtins.open('/etc/hostname')\"):\n    return t\n"
        "def kernel(x):\n    return f(x)\n",
        HEADER + "def f(t):\n    # type: (__import__('os')) -> None\n    return t\n"
        "def kernel(x):\n    return f(x)\n",
        HEADER + "x: 'torch.List[\"torch.builtins\"]' = 1\ndef kernel(x):\n    return x\n",
    ],
)
def test_annotations_that_get_evaluated_are_checked(source: str) -> None:
    assert "forbidden-call" in codes(source)


def test_honest_annotations_pass() -> None:
    source = (
        HEADER + "import typing\n"
        "def f(t: 'torch.Tensor', n: typing.Optional[int] = None) -> 'torch.Tensor':\n"
        "    return t  # type: ignore[return-value]\n"
        "def kernel(x: torch.Tensor) -> torch.Tensor:\n    return f(x)\n"
    )
    assert codes(source) == set()


def test_star_imports_are_banned() -> None:
    assert "forbidden-import" in codes(kernel_source("pass", "from torch import *\n"))


def test_load_is_file_io_anywhere_under_torch_but_not_under_triton() -> None:
    assert "forbidden-call" in codes(kernel_source("m = torch.jit.load('/tmp/m.pt')"))
    triton_load = "import triton.language as tl\n"
    assert codes(kernel_source("f = tl.load", triton_load)) == set()


def test_attributes_read_in_an_assignment_index_are_not_assignments() -> None:
    source = HEADER + "_cache = {}\ndef kernel(x):\n    _cache[x.shape] = x\n    return x\n"
    assert codes(source) == set()
    source = HEADER + "def kernel(x):\n    torch.cuda.__dict__['synchronize'] = x\n    return x\n"
    assert "foreign-attribute-assignment" in codes(source)
    source = HEADER + "def kernel(x):\n    a, torch.special.b = 1, 2\n    return x\n"
    assert "foreign-attribute-assignment" in codes(source)


def reasons_of(source: str) -> list[tuple[str, str]]:
    return [(r.code, r.message) for r in check_source(source, "cand.py").reasons]


NP = "import numpy as np\n"


@pytest.mark.parametrize(
    "body",
    [
        "np.frombuffer(b'x', dtype=np.uint8).dump('/proc/self/fd/1')",
        "s = np.zeros(1).dumps()",
        "a = np.fromregex('/etc/hostname', 'x', [('f', 'U9')])",
        "d = np.lib.npyio.DataSource('/tmp')",
        "m = np.lib.format.open_memmap('/tmp/m.npy', mode='w+')",
        "f = np.lib.format.write_array",
        "f = [np][0].load('/tmp/a.npy')",
        "f = torch.utils.cpp_extension.load",
        "f = torch.utils.tensorboard.SummaryWriter",
        "x.export_chrome_trace('/tmp/t.json')",
        "f = torch.onnx.export",
        "f = torch.classes.load_library",
        "f = torch.cuda.tunable",
        "f = x.write",
        "f = x.read",
        "f = np.testing.measure",
        "f = np.f2py",
        "f = torch.cuda.memory.CUDAPluggableAllocator",
        "f = torch.utils.collect_env",
    ],
)
def test_file_and_native_code_doors_are_banned(body: str) -> None:
    assert "forbidden-call" in codes(kernel_source(body, NP))


def test_triton_and_own_load_store_stay_legal() -> None:
    source = (
        "import triton\nimport triton.language as tl\n" + HEADER + "class Cache:\n"
        "    def load(self, k):\n        return k\n"
        "@triton.jit\ndef _copy(src, dst):\n    tl.store(dst, tl.load(src))\n"
        "def kernel(x):\n    return Cache().load(x)\n"
    )
    assert codes(source) == set()


@pytest.mark.parametrize(
    "source",
    [
        kernel_source("dataclasses._create_fn('f', [], ['pass'])()", "import dataclasses\n"),
        kernel_source("f = torch.cuda.memory._dump_snapshot"),
        kernel_source("f = torch.__loader__.get_data"),
        kernel_source("f = torch.nn.functional.__spec__"),
        kernel_source("pass", "from dataclasses import _create_fn\n"),
        kernel_source("pass", "import torch._refs\n"),
        kernel_source("pass", "from torch._prims import utils\n"),
        # defining a name does not make it legal on a module
        "import dataclasses\nclass A:\n    _create_fn = None\n"
        + kernel_source("f = dataclasses._create_fn"),
    ],
)
def test_private_attributes_are_banned(source: str) -> None:
    found = reasons_of(source)
    assert any("private" in message for code, message in found if code.startswith("forbidden")), (
        found
    )


@pytest.mark.parametrize(
    "body",
    [
        "b = __builtins__['open']",
        "d = __loader__.get_data('/etc/hostname')",
        "s = __spec__",
        "c = __build_class__",
    ],
)
def test_module_dunders_that_are_doors_are_banned(body: str) -> None:
    assert "forbidden-call" in codes(kernel_source(body))


def test_private_names_the_candidate_defines_pass() -> None:
    source = (
        "import torch.distributed._symmetric_memory as symm_mem\n" + HEADER + "_TABLE = {}\n"
        "def _helper(t):\n    return t * 2\n"
        "class Box(torch.nn.Module):\n    _shared = 1\n"
        "    def __init__(self):\n        super().__init__()\n        self._cache = {}\n"
        "    def _get(self, t):\n        return self._cache.get(t.shape, Box._shared)\n"
        "def kernel(x):\n    kernel._calls = 1\n    name = __name__\n"
        "    v = x._version\n    return _helper(x) * Box()._get(x)\n"
    )
    assert codes(source) == set()


def test_private_allow_list_is_only_what_candidates_use() -> None:
    """Each allow-listed private name is used by a shipped kernel or a red-team candidate."""
    roots = [kernels_root(), Path(__file__).parents[1] / "redteam"]
    text = "".join(p.read_text() for root in roots for p in root.rglob("*.py"))
    namedtuple_api = {"_replace", "_asdict", "_fields", "_make"}
    assert {n for n in PRIVATE_ALLOWED - namedtuple_api if f".{n}" not in text} == set()


@pytest.mark.parametrize(
    "source",
    [
        kernel_source("pass", "import torch.fx\n"),
        kernel_source("pass", "from torch.fx import Interpreter\n"),
        kernel_source("g = torch.fx.Graph()"),
        kernel_source("cu = torch.jit.CompilationUnit('def f(x):\\n    return x\\n')"),
        kernel_source("f = torch.nn.Module.set_submodule"),
    ],
)
def test_calls_by_run_time_name_are_banned(source: str) -> None:
    assert codes(source) & {"forbidden-call", "forbidden-import"}


@pytest.mark.parametrize(
    "source",
    [
        kernel_source("p = torch.profiler.profile()"),
        kernel_source("p = torch.autograd.profiler.record_function('k')"),
        kernel_source("p = torch.autograd.profiler_legacy"),
        kernel_source("pass", "import torch.profiler\n"),
        kernel_source("pass", "from torch.autograd import profiler\n"),
        kernel_source("r = torch.record_function"),
    ],
)
def test_profilers_are_banned(source: str) -> None:
    assert codes(source) & {"forbidden-call", "forbidden-import"}


@pytest.mark.parametrize(
    "helper",
    [
        "def held():\n    with torch.no_grad():\n        yield\n",
        "def held():\n    try:\n        yield 1\n    finally:\n        pass\n",
        "async def held():\n    return 1\n",
        "def outer():\n    async def inner(c):\n        await c\n    return inner\n",
    ],
)
def test_generators_and_coroutines_are_banned(helper: str) -> None:
    found = reasons_of(HEADER + helper + "def kernel(x):\n    return x\n")
    assert any(code == "forbidden-call" for code, _ in found), found


def test_comprehensions_and_contexts_pass() -> None:
    source = (
        HEADER + "def kernel(x):\n    with torch.no_grad():\n"
        "        parts = list(t * 2 for t in x.unbind(0))\n"
        "        s = '{}x{}'.format(*x.shape)\n"
        "    return torch.stack(parts) if s else x\n"
    )
    assert codes(source) == set()


def test_a_module_is_only_ever_the_root_of_an_attribute() -> None:
    door = (
        "import dataclasses\n"
        "import torch\n"
        'LANGUAGE = "torch"\n'
        "class _D:\n"
        "    _create_fn = None\n"
        "    def go(self):\n"
        "        return self._create_fn('f', [], ['return 1'])\n"
        "def kernel(x):\n"
        "    _D.go(dataclasses)\n"
        "    return torch.neg(x)\n"
    )
    assert "forbidden-call" in {r.code for r in check_source(door, "c.py").reasons}
    for passed in ("m = torch", "y = f(torch)", "y = [torch]"):
        assert "forbidden-call" in codes(kernel_source(passed)), passed
    honest = "y = isinstance(torch.empty(3), torch.Tensor)"
    assert codes(kernel_source(honest)) == set()
    from_module = "from triton import language\nimport torch\nLANGUAGE = 'torch'\n"
    from_module += "def kernel(x):\n    y = [language]\n    return torch.neg(x)\n"
    assert "forbidden-call" in {r.code for r in check_source(from_module, "c.py").reasons}


@pytest.mark.parametrize(
    "body",
    [
        "T = [torch.nn.functional.torch][0]\n    T.rsqrt = abs",
        "if (T := torch.nn.functional.torch) is not None:\n        T.rsqrt = abs",
        "for T in (torch.nn.functional.torch,):\n        T.rsqrt = abs",
        "y = x\n    y.data = x",
        "y = [x]\n    y[0].grad = None",
    ],
)
def test_only_the_candidates_own_objects_have_attributes_assigned(body: str) -> None:
    assert "foreign-attribute-assignment" in codes(kernel_source(body))


def test_own_objects_and_kernel_settings_may_have_attributes_assigned() -> None:
    source = (
        "import torch\nLANGUAGE = 'torch'\n"
        "class _Cfg:\n    def __init__(self):\n        self.block = 4\n"
        "def _compiled():\n    return _Cfg()\n"
        "def kernel(x):\n"
        "    cfg = _Cfg()\n    cfg.block = 8\n    kernel.calls = 1\n    _Cfg.shared = 2\n"
        "    kern = _compiled()\n    kern.max_dynamic_shared_size_bytes = 1 << 16\n"
        "    return torch.neg(x)\n"
    )
    assert [r.message for r in check_source(source, "c.py").reasons] == []


def test_a_finalizer_bound_in_a_class_body_is_a_finalizer() -> None:
    source = (
        "import torch\nLANGUAGE = 'torch'\n"
        "def _fire(self):\n    return None\n"
        "class _Poll:\n    __del__ = _fire\n"
        "def kernel(x):\n    return torch.neg(x)\n"
    )
    assert "forbidden-call" in {r.code for r in check_source(source, "c.py").reasons}


@pytest.mark.parametrize(
    "body",
    [
        "y = getattr(torch, 'float8_e4m3fn', None)",
        "y = hasattr(torch, 'float8_e4m3fn')",
        "y = 1 if torch is not None else 0",
        "def _chunks(n):\n        yield from range(n)\n    y = list(_chunks(3))",
        "y = type(x).__name__",
    ],
)
def test_honest_idioms_pass(body: str) -> None:
    assert codes(kernel_source(body)) == set(), body


@pytest.mark.parametrize(
    "body",
    [
        "y = getattr(torch, 'builtins')",
        "y = getattr(torch, '_C')",
        "y = getattr(torch, x)",
    ],
)
def test_getattr_is_an_attribute_read_only_with_a_harmless_literal(body: str) -> None:
    assert "forbidden-call" in codes(kernel_source(body))


def test_a_self_test_block_is_not_checked_but_may_not_rename_the_module() -> None:
    tail = '\nif __name__ == "__main__":\n    import time\n    torch.manual_seed(0)\n'
    assert codes(kernel_source("y = x") + tail) == set()
    renamed = kernel_source("y = x") + '__name__ = "__main__"\n' + tail
    assert "forbidden-call" in codes(renamed)


def test_a_method_read_through_its_class_is_banned() -> None:
    source = (
        "import torch\nLANGUAGE = 'torch'\n"
        "class _Box:\n    def __init__(self):\n        self.stream = 0\n"
        "    def go(self):\n        return self.stream\n"
        "    @staticmethod\n    def make():\n        return _Box()\n"
        "def kernel(x):\n    b = _Box.make()\n    _Box.go(torch.cuda)\n    return torch.neg(x)\n"
    )
    # `self.stream` is the box's own field; reading `go` through the class is what is banned
    messages = [r.message for r in check_source(source, "c.py").reasons]
    assert "line 13: _Box go (a method read through its class)" in messages
    assert "line 13: the module torch.cuda used as a value" in " ".join(messages)


@pytest.mark.parametrize(
    "body",
    [
        "y = [torch.nn.functional.torch][0]",
        "y = f(torch.cuda)",
        "F = torch.nn.functional",
    ],
)
def test_a_module_reached_through_attributes_is_no_value_either(body: str) -> None:
    assert "forbidden-call" in codes(kernel_source(body)), body


@pytest.mark.parametrize(
    "source",
    [
        "def hasattr(obj, name):\n    return obj\n",
        "import torch as getattr\n",
        "match 1:\n    case __name__:\n        pass\n",
        "class type:\n    pass\n",
    ],
)
def test_the_builtins_the_checks_trust_may_not_be_rebound(source: str) -> None:
    assert "forbidden-call" in codes(HEADER + source + "def kernel(x):\n    return x\n")


def test_only_tritons_own_jit_makes_device_code() -> None:
    own = (
        "import torch\nLANGUAGE = 'torch'\n"
        "def jit(f):\n    return f\n"
        "@jit\ndef _load(p):\n    return torch.load(p)\n"
        "def kernel(x):\n    return x\n"
    )
    assert "forbidden-call" in {r.code for r in check_source(own, "c.py").reasons}


KERNEL = "def kernel(x, weight):\n    return x\n"


@pytest.mark.parametrize(
    "body",
    [
        "if torch.compiler.is_compiling():\n    pass\n",
        "from torch.compiler import is_compiling\n",
        "from triton.compiler.errors import CompilationError\n",
        "import triton\nE = triton.compiler.errors.CompilationError\n",
        "import functools\ndef deco(fn):\n    @functools.wraps(fn)\n    def inner(*a):\n"
        "        return fn(*a)\n    return inner\n",
        "class Base:\n    def _block(self):\n        return 1\n"
        "class Launcher(Base):\n    def _block(self):\n        return super()._block() + 1\n",
        "class Box:\n    pass\nCACHE: dict[str, Box] = {}\nPAIR: tuple[Box, ...] = ()\n",
    ],
    ids=[
        "is-compiling",
        "import-is-compiling",
        "compile-error",
        "compile-error-attr",
        "wraps",
        "own-super-private",
        "annotations",
    ],
)
def test_honest_uses_next_to_the_new_bans_pass(body: str) -> None:
    assert codes(HEADER + body + KERNEL) == set()


@pytest.mark.parametrize(
    "body",
    [
        "torch.compiler.set_stance('force_eager')\n",
        "c = torch.compiler\n",
        "from torch.compiler import set_stance\n",
        "import functools\ndef own(x):\n    return x\nfunctools.wraps(own)(torch.rsqrt)\n",
        "import functools\ndef deco(fn):\n    @functools.wraps(fn, updated=('__globals__',))\n"
        "    def inner(*a):\n        return fn(*a)\n    return inner\n",
        "import enum\nclass E(enum.IntEnum):\n    def go(self):\n        return super()._missing_(1)\n",
        "class Box:\n    pass\nCACHE: make(Box) = {}\n",
    ],
    ids=[
        "set-stance",
        "compiler-as-value",
        "import-set-stance",
        "wraps-applied-to-foreign",
        "wraps-updated",
        "library-super-private",
        "annotation-call",
    ],
)
def test_the_bans_next_to_them_still_hold(body: str) -> None:
    assert "forbidden-call" in codes(HEADER + body + KERNEL) | {
        c for c in codes(HEADER + body + KERNEL) if c == "forbidden-import"
    } or "forbidden-import" in codes(HEADER + body + KERNEL)


def test_the_harness_parses_one_thread_at_a_time(monkeypatch) -> None:
    """CPython 3.11 keeps the AST constructor's recursion depth per interpreter: two threads
    parsing at once can fail with a SystemError (gh-106905; seen in CI with concurrent
    evaluations). guards.parse lets one thread in at a time; a slow stand-in for ast.parse
    records how many threads were inside it at once."""
    import threading
    import time

    from loop import guards

    inside, most = [0], [0]
    real_parse = ast.parse

    def slow_parse(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        inside[0] -= 1
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(guards.ast, "parse", slow_parse)

    def run(fn) -> int:
        most[0] = 0
        threads = [threading.Thread(target=fn, args=("x = 1",)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return most[0]

    assert run(guards.ast.parse) > 1  # the stand-in alone does overlap
    assert run(guards.parse) == 1

"""Static checks of a candidate's source, from its syntax tree.

What a candidate may import and call, that it assigns no attribute of a module it did not define,
that its declared LANGUAGE does the work, and that it does not call the task's reference, its
peers or a library op that implements the task (under any spelling: `RMSNorm` is `rms_norm`).
A ban list, not a sandbox: banned names are banned as attributes too, because allowed modules
re-export dangerous ones (`torch.builtins`, `dataclasses._thread`); string annotations and type
comments are checked as the code they become when typing or torch.jit evaluates them.
"""

from __future__ import annotations

import ast
import functools
import importlib
import io
import re
import threading
import tokenize
import types
from dataclasses import dataclass

from loop.reasons import Reason, reason

# CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: two
# threads parsing at once can fail with "AST constructor recursion depth mismatch" (gh-106905),
# and evaluations run in threads (CI, 3.11.7). Every parse of the harness goes through one lock.
_PARSE_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, one thread at a time."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename, mode=mode)


LANGUAGES = ("triton", "cuda", "cupy", "torch")

ALLOWED_MODULES = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "copy",
    "heapq",
    "warnings",
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
    # a builtin's __self__ is its module; a method's __func__ takes any self; descriptors and
    # class hooks run code at class creation or attribute access
    "__self__": "reaching the module or object behind a callable",
    "get_device_module": "a call that returns a module",
    "__func__": "detaching a method (any object as self)",
    "__wrapped__": "reaching a wrapped function",
    "__objclass__": "reaching a descriptor's class",
    "__get__": "descriptor access",
    "__set_name__": "class-creation hooks",
    "__init_subclass__": "class-creation hooks",
    "__class_getitem__": "class-creation hooks",
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
    # torch.utils.cpp_extension (a load_inline candidate's import) imports setuptools, which
    # re-exports distutils (spawn, file and directory operations, run_setup), importlib.metadata
    # (entry points import any module) and its own module-importing helpers
    "setuptools": "build tooling (processes, file operations, imports)",
    "distutils": "build tooling (processes, file operations, imports)",
    "pkg_resources": "build tooling (processes, file operations, imports)",
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
    "set_default_tensor_type": "changing the harness's defaults",
    # more file I/O without open(): ndarray.dump writes any path (/proc/self/fd/N is the
    # worker's result pipe), fromregex reads any file; numpy's npy/npz helpers, profiler
    # traces, tensorboard, onnx, downloads, tuning files, loaders' get_data
    "dump": "file I/O",
    "dumps": "pickling",
    "loads": "unpickling",
    "fromregex": "file I/O",
    "DataSource": "file I/O",
    "open_memmap": "file I/O",
    "read_array": "file I/O",
    "write_array": "file I/O",
    "NpzFile": "file I/O",
    "npyio": "file I/O",
    "savez_compressed": "file I/O",
    "export_chrome_trace": "file I/O",
    "export_stacks": "file I/O",
    "export_memory_timeline": "file I/O",
    "tensorboard": "file I/O",
    "SummaryWriter": "file I/O",
    "onnx": "file I/O",
    "model_zoo": "downloads and file I/O",
    "load_url": "downloads and file I/O",
    "download_url_to_file": "downloads and file I/O",
    "tunable": "file I/O and changing the harness's GEMM algorithms",
    "read": "file I/O",
    "write": "file I/O",
    "readlines": "file I/O",
    "writelines": "file I/O",
    "read_text": "file I/O",
    "write_text": "file I/O",
    "read_bytes": "file I/O",
    "write_bytes": "file I/O",
    "get_data": "file I/O (a module loader's get_data reads any path)",
    "to_file": "file I/O",
    "file_baton": "file I/O",
    "FileBaton": "file I/O",
    "collect_env": "starting processes (collect_env.run runs shell commands)",
    # loading native code or starting processes through public helpers
    "load_library": "loading native libraries",
    "CUDAPluggableAllocator": "loading native libraries as the harness's allocator",
    "change_current_allocator": "replacing the harness's allocator",
    "f2py": "building native code and starting processes",
    "extbuild": "building native code",
    "testing": "numpy.testing runs code from strings (measure, runstring, rundocs)",
    "benchmark": "torch.utils.benchmark runs code from strings",
    "DataLoader": "starting processes (workers)",
    "rpc": "remote calls by name",
    # calling by run-time string: torch.fx's Interpreter runs call_method nodes as
    # getattr(obj, name); TorchScript compiled from a string calls any op by name
    "fx": "calls by run-time name (torch.fx)",
    "Interpreter": "calls by run-time name (torch.fx)",
    "GraphModule": "code generated and run from a graph (torch.fx)",
    "symbolic_trace": "calls by run-time name (torch.fx)",
    "CompilationUnit": "TorchScript compiled from a string",
    "set_submodule": "attribute assignment by run-time name",
    "Formatter": "attribute access by run-time name (Formatter.get_field)",
    "get_field": "attribute access by run-time name",
    # profilers left running tax every later torch call of the harness and the rivals
    "record_function": "profiling (it stays on for the harness and the rivals)",
    "emit_nvtx": "profiling (it stays on for the harness and the rivals)",
    "emit_itt": "profiling (it stays on for the harness and the rivals)",
    "set_detect_anomaly": "anomaly mode taxes every later torch call",
    "detect_anomaly": "anomaly mode taxes every later torch call",
    # process-wide switches that change how the harness's and rivals' ops run
    "set_flush_denormal": "changing the harness's float behaviour",
    "set_sync_debug_mode": "changing how the harness's syncs behave",
    "enable_flash_sdp": "changing the rivals' attention kernels",
    "enable_mem_efficient_sdp": "changing the rivals' attention kernels",
    "enable_math_sdp": "changing the rivals' attention kernels",
    "enable_cudnn_sdp": "changing the rivals' attention kernels",
    "preferred_blas_library": "changing the rivals' BLAS",
    "preferred_linalg_library": "changing the rivals' linear algebra library",
    "register_module_forward_hook": "global module hooks",
    "register_module_forward_pre_hook": "global module hooks",
    "register_module_full_backward_hook": "global module hooks",
    "register_module_full_backward_pre_hook": "global module hooks",
    # writes into another module's namespace: enum.global_enum updates
    # sys.modules[cls.__module__] (a class body can name any module there)
    "global_enum": "writing into another module's namespace",
    # update_wrapper/wraps set and update attributes by name on any object (`__globals__`)
    "update_wrapper": "attribute assignment by run-time name",
    "wraps": "attribute assignment by run-time name",
    # the warnings module's helpers read any file (formatwarning's linecache) or replace how the
    # harness's and rivals' warnings are shown
    "formatwarning": "file I/O (linecache reads any path)",
    "showwarning": "changing how the harness's warnings are shown",
    "warn_explicit": "warnings attributed to any file and module",
    # set_ points an input buffer at other memory, or makes it require grad, with equal values
    "set_": "replacing a tensor's storage (the harness's input buffers)",
    # class hooks run inside anyone's isinstance and issubclass checks; copy and pickle hooks
    # set attributes by run-time name
    "__subclasshook__": "class hooks run inside the harness's and rivals' isinstance checks",
    "__instancecheck__": "class hooks run inside the harness's and rivals' isinstance checks",
    "__subclasscheck__": "class hooks run inside the harness's and rivals' isinstance checks",
    "__reduce__": "copy and pickle hooks set attributes by run-time name",
    "__reduce_ex__": "copy and pickle hooks set attributes by run-time name",
    "__copy__": "copy and pickle hooks set attributes by run-time name",
    "__deepcopy__": "copy and pickle hooks set attributes by run-time name",
    "__setstate__": "copy and pickle hooks set attributes by run-time name",
    "__getstate__": "copy and pickle hooks set attributes by run-time name",
    "__module__": "naming another module as a class's own (enum and dataclasses write there)",
    "set_module": "naming another module as an object's own",
    # views of raw memory: numpy's as_strided checks no bounds, and an array interface of one's
    # own hands numpy any address
    "as_strided": "raw memory views",
    "stride_tricks": "raw memory views",
    "__array_interface__": "raw memory views",
    "__array_struct__": "raw memory views",
    "__array__": "raw memory views",
    "__cuda_array_interface__": "raw memory views",
    # Triton's process-wide hooks run inside every other runner's launches and captures
    "knobs": "Triton's process-wide hooks and settings",
    "set_active": "replacing Triton's driver",
    "reset_active": "replacing Triton's driver",
    "swap_tensors": "swapping the class of the harness's tensors",
    # the compiler's stance and backend decide what the torch.compile peer runs
    "compiler": "changing how the torch.compile peer compiles (set_stance, set_default_backend)",
    "set_stance": "changing how the torch.compile peer compiles",
    # process-wide switches not covered above
    "set_anomaly_enabled": "anomaly mode taxes every later torch call",
    "set_warn_always": "changing how the harness's warnings are shown",
    "enter_dual_level": "forward-mode autograd left on for every later torch call",
    "set_fastpath_enabled": "changing the rivals' attention kernels",
    "set_flags": "changing the rivals' backend flags",
    "allow_fp16_bf16_reduction_math_sdp": "changing the rivals' attention precision",
    "register_module_buffer_registration_hook": "global module hooks",
    "register_module_module_registration_hook": "global module hooks",
    "register_module_parameter_registration_hook": "global module hooks",
}

# Private names (a leading underscore, dunders included) are banned as attributes and import
# paths: the stdlib's and torch's private helpers are doors (dataclasses._create_fn execs text,
# torch.cuda.memory._dump_snapshot writes files). Names the candidate defines on its own
# classes and objects are exempt (see _own_names), and these, which honest kernels need:
PRIVATE_ALLOWED = {
    # the allreduce kernels' symmetric-memory rendezvous has no public spelling yet
    "_symmetric_memory",
    # a tensor's read-only write counter: no door; tricks built on it (spotting timed samples)
    # are caught at run time by re-verification (red-team candidate skips_timed_samples.py)
    "_version",
    # namedtuple's public API is spelled with an underscore
    "_replace",
    "_asdict",
    "_fields",
    "_make",
}

# Dunders that are plain strings or tables to read: a name, a version, a docstring, an enum's
# members (reading them reaches no code).
READABLE_DUNDERS = {"__name__", "__qualname__", "__version__", "__doc__", "__members__"}

# Module-level dunders a candidate may read without defining them: strings only.
# (`__builtins__`, `__loader__`, `__spec__` and `__build_class__` are doors.)
SAFE_MODULE_DUNDERS = {"__name__", "__doc__", "__file__", "__qualname__", "__module__", "__debug__"}

# Generators and coroutines keep `with` blocks open after their frame returns and run their
# `finally` from the garbage collector, at a time the harness does not choose.
SUSPENDING = {
    ast.Yield: "yield (a generator keeps contexts open and runs its finally at any time)",
    ast.YieldFrom: "yield from (a generator keeps contexts open and runs its finally at any time)",
    ast.Await: "await (a coroutine keeps contexts open and runs its finally at any time)",
    ast.AsyncFunctionDef: "async def (a coroutine keeps contexts open)",
    ast.AsyncFor: "async for (a coroutine keeps contexts open)",
    ast.AsyncWith: "async with (a coroutine keeps contexts open)",
}

# Modules that allowed packages re-export as attributes (torch.builtins, dataclasses._thread,
# enum.bltns, typing.collections._sys, triton.knobs.pathlib, ...): banned as attribute names, also
# with their leading underscores stripped (`_os`, `_sys`, `_inspect`, `_pytest`, ...).
MODULE_DOORS = {
    "builtins": "builtins access",
    "bltns": "builtins access",
    "_sitebuiltins": "builtins access",
    "sys": "reaching the interpreter",
    "os": "reaching the operating system",
    "posix": "reaching the operating system",
    "nt": "reaching the operating system",
    "_osp": "reaching the operating system",
    "_thread": "starting threads",
    "threading": "starting threads",
    "_cyb_threading": "starting threads",
    "concurrent": "starting threads",
    "asyncio": "starting threads and processes",
    "multiprocessing": "starting processes",
    "mp": "starting processes",
    "python_multiprocessing": "starting processes",
    "reducer": "process pickling and descriptor passing",
    "reduction": "process pickling and descriptor passing",
    "posixshmem": "shared memory",
    "subprocess": "starting processes",
    "platform": "starting processes",
    "pty": "starting processes",
    "gc": "object graph walking",
    "inspect": "frame access",
    "traceback": "frame access",
    "tracemalloc": "object graph walking",
    "dis": "code object access",
    "pdb": "debugger",
    "bdb": "debugger",
    "faulthandler": "signal handlers",
    "signal": "signal handlers",
    "atexit": "running code at exit",
    "weakref": "finalizers",
    "pickle": "unpickling",
    "marshal": "code objects",
    "copyreg": "changing how the harness pickles",
    "shelve": "file I/O",
    "dbm": "file I/O",
    "sqlite3": "file I/O",
    "io": "file I/O",
    "codecs": "file I/O",
    "pathlib": "file I/O",
    "tempfile": "file I/O",
    "glob": "file system walking",
    "shutil": "file operations",
    "linecache": "file I/O",
    "tokenize": "file I/O",
    "zipfile": "file I/O",
    "tarfile": "file I/O",
    "gzip": "file I/O",
    "bz2": "file I/O",
    "lzma": "file I/O",
    "mmap": "raw memory and file I/O",
    "fcntl": "file descriptor control",
    "termios": "file descriptor control",
    "resource": "changing the worker's limits",
    "socket": "network access",
    "ssl": "network access",
    "http": "network access",
    "urllib": "network access",
    "grpc": "network access",
    "logging": "file I/O through log handlers",
    "colorlog": "file I/O through log handlers",
    "argparse": "file I/O (FileType)",
    "operator": "dynamic attribute access (attrgetter, methodcaller)",
    "types": "building functions and modules from code objects",
    "runpy": "running code",
    "code": "running code",
    "codeop": "dynamic code",
    "timeit": "running code from strings",
    "imp": "dynamic import",
    "zipimport": "dynamic import",
    "pkgutil": "dynamic import",
    "site": "dynamic import",
    "util": "ctypes.util: loading libraries",
    "unittest": "mock.patch assigns attributes by name",
    "mock": "mock.patch assigns attributes by name",
    "pytest": "monkeypatching",
    "pluggy": "plugin hooks",
    "pynvml": "changing the GPU's clocks and limits",
    "sqlalchemy": "database and file I/O",
    "alembic": "database and file I/O",
    "optuna": "database and file I/O",
    "hub": "downloads and file I/O",
    "serialization": "file I/O",
    "package": "file I/O and imports",
    "torchgen": "file I/O",
    "py_sys": "reaching the interpreter",
    "py_operator": "dynamic attribute access (attrgetter, methodcaller)",
    "wintypes": "raw memory and C calls",
    "_cuda_bindings_driver": "raw CUDA driver access",
    "_cuda_bindings_runtime": "raw CUDA runtime access",
}

# Process-wide hooks into torch: a mode or dispatcher override left in place sees every torch
# call the harness makes afterwards (its reference, error norms, the peers).
TORCH_HOOKS = {
    "_C": "torch's C bindings (mode stacks, dispatcher, raw state)",
    "overrides": "torch function modes",
    "TorchFunctionMode": "torch function modes",
    "TorchDispatchMode": "torch dispatch modes",
    "_python_dispatch": "torch dispatch modes",
    "_mode_utils": "torch modes",
    "_push_mode": "torch modes",
    "_pop_mode": "torch modes",
    "_set_torch_function_mode": "torch modes",
    "DisableTorchFunction": "torch function modes",
    "DisableTorchFunctionSubclass": "torch function modes",
    "_disabled_torch_function_impl": "torch function modes",
    "_subclasses": "fake and functional tensor modes",
    "FakeTensorMode": "fake tensor modes",
    "proxy_tensor": "tracing modes",
    "make_fx": "tracing modes",
    "_dynamo": "torch.compile's frame-evaluation hooks",
    "_inductor": "torch.compile's machinery",
    "library": "re-registering operators (torch.library)",
    "Library": "re-registering operators (torch.library)",
    "custom_op": "re-registering operators (torch.library)",
    "custom_ops": "re-registering operators (torch.library)",
    "register_kernel": "re-registering operators (torch.library)",
    "register_fake": "re-registering operators (torch.library)",
    "register_autograd": "re-registering operators (torch.library)",
    "register_torch_dispatch": "re-registering operators (torch.library)",
    "register_vmap": "re-registering operators (torch.library)",
    "impl_abstract": "re-registering operators (torch.library)",
    "fallthrough_kernel": "re-registering operators (torch.library)",
    "__torch_function__": "torch function overrides",
    "__torch_dispatch__": "torch dispatch overrides",
    "__del__": "finalizers run at arbitrary times inside the harness",
    "finalize": "finalizers run at arbitrary times inside the harness",
    "weak": "finalizers (torch.utils.weak)",
    "__enter__": "entering a context by hand (it stays entered after the kernel returns)",
    "__exit__": "leaving a context by hand",
    "ExitStack": "entering contexts that outlive the kernel",
    "enter_context": "entering contexts that outlive the kernel",
    "contextlib": "entering contexts that outlive the kernel",
    "script": "torch.jit.script evaluates annotations and type comments; a compiler, not a kernel",
    "script_method": "torch.jit.script evaluates annotations and type comments",
    # typing/functools evaluate string annotations (get_type_hints via singledispatch.register)
    "get_type_hints": "evaluating annotations",
    "ForwardRef": "evaluating annotations",
    "_eval_type": "evaluating annotations",
    "evaluate_forward_ref": "evaluating annotations",
    "_type_check": "evaluating annotations",
    "__annotations__": "evaluating annotations",
}

# Attributes of compiled-kernel objects that a kernel sets to launch (CuPy's RawKernel): only
# kernel objects have them, so setting one anywhere else changes nothing anyone reads.
KERNEL_SETTINGS = {"max_dynamic_shared_size_bytes", "preferred_shared_memory_carveout"}

# A task's FORBIDDEN_OPS may name a family of library ops at once (task files import nothing of
# the harness): "library-gemm" every library matrix product, "library-norm" every library
# normalisation, "library-softmax" every library softmax, "library-attention" every library
# attention. A name of LONG_OP or more letters (underscores and case ignored) is forbidden
# inside a library's longer names too (torch.native_layer_norm, nn.CrossEntropyLoss,
# nn.Softmax2d); a shorter one only as itself (`mm` would forbid `symmetric_memory`, `linear`
# Gluon's `DistributedLinearLayout`). Dot products are apart (LIBRARY_DOTS): Triton's is allowed.
LONG_OP = 7
LIBRARY_GEMM = "library-gemm"
LIBRARY_GEMM_OPS = (
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "addmv",
    "addbmm",
    "baddbmm",
    "mv",
    "linear",
    "lazylinear",
    "bilinear",
    "einsum",
    "tensordot",
    "inner",
    "chain_matmul",
    "multi_dot",
    "_scaled_mm",
    "scaled_grouped_mm",
    "grouped_mm",
    "_int_mm",
    "gemm",
    "cublas",
    "fbgemm_linear",
    # sparse products take dense operands too
    "smm",
    "spmm",
    "hspmm",
    "dsmm",
    "saddmm",
    "sspaddmm",
    # a convolution with a 1-wide kernel, and a distance's cross term, are matrix products
    "conv1d",
    "conv2d",
    "conv3d",
    "lazy_conv",
    "conv_transpose",
    "conv_tbc",
    "convolution",
    "conv_relu",
    "convbn1d",
    "convbn2d",
    "convbn3d",
    "convbnrelu",
    "cdist",
    # so are the layers built on them
    "multi_head_attention",
    "transformer",
    "rnn",
    "gru",
    "lstm",
    "rnn_relu_cell",
    "rnn_tanh_cell",
    "rnn_cell",
    "gru_cell",
    "lstm_cell",
)
# Dot products are library products too, from torch, numpy or CuPy (torch.vmap of torch.dot is a
# matrix product); Triton's and Gluon's tl.dot is the kernel's own.
LIBRARY_DOTS = ("dot", "vdot", "vecdot")
LIBRARY_NORM_OPS = (
    "rms_norm",
    "layer_norm",
    "group_norm",
    "batch_norm",
    "instance_norm",
    "local_response_norm",
    "normalize",
    "renorm",
    "norm_except_dim",
    "weight_norm",
)
LIBRARY_SOFTMAX_OPS = (
    "softmax",
    "log_softmax",
    "softmin",
    "logsumexp",
    "logcumsumexp",
    "logaddexp",
    # a categorical distribution's probs are the softmax of its logits
    "distributions",
    "categorical",
)
LIBRARY_ATTENTION_OPS = (
    "scaled_dot_product",
    "flash_attn",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "flex_attention",
    "varlen_attn",
    "multi_head_attention",
    "causal_lower_right",
    "flash_mla",
    "transformer",
)
LIBRARY_OPS = {
    LIBRARY_GEMM: LIBRARY_GEMM_OPS,
    "library-norm": LIBRARY_NORM_OPS,
    "library-softmax": LIBRARY_SOFTMAX_OPS,
    "library-attention": LIBRARY_ATTENTION_OPS,
}

# Methods a candidate may not define: they run inside the harness, at times it does not choose.
HOOK_METHODS = (
    "__torch_function__",
    "__torch_dispatch__",
    "__del__",
    "__init_subclass__",
    "__set_name__",
    "__class_getitem__",
    "__subclasshook__",
    "__instancecheck__",
    "__subclasscheck__",
    "__reduce__",
    "__reduce_ex__",
    "__copy__",
    "__deepcopy__",
    "__setstate__",
    "__getstate__",
)
# Names a class body may not bind: the hooks, and what makes a class claim another module or
# carry another function's code and globals.
CLASS_BODY_BANNED = (
    *HOOK_METHODS,
    "__module__",
    "__globals__",
    "__code__",
    "__dict__",
    "__array_interface__",
    "__array_struct__",
    "__array__",
    "__cuda_array_interface__",
)
# Strings that name these are attribute access by run-time name waiting to happen.
NAMED_IN_STRINGS = set(CLASS_BODY_BANNED) | {
    "__defaults__",
    "__kwdefaults__",
    "__closure__",
    "__builtins__",
    "__self__",
    "__func__",
    "__wrapped__",
    "__setattr__",
    "__getattribute__",
}

# `.load` (numpy.load, torch.load, torch.jit.load, torch.utils.cpp_extension.load) reads files
# and unpickles: banned on anything but Triton (`tl.load`) and the candidate's own objects.
LOAD_ALLOWED_ROOTS = {"triton"}

TYPE_COMMENT = re.compile(r"#\s*type\s*:(?!\s*ignore\b)")


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
        # launched through a variable, a dict of variants or a partial: its name is read
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in jitted:
            found.add("triton")
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


def banned_attribute(name: str) -> str | None:
    """Why the attribute (or imported name) `name` is banned, or None. A builtin banned as a name
    is banned as an attribute too (`torch.builtins.open`); a banned name with its leading
    underscores stripped is banned as well (`typing.collections._sys`, `torch._library`)."""
    for candidate in (name, name.lstrip("_")):
        for table in (FORBIDDEN_ATTRIBUTES, FORBIDDEN_NAMES, MODULE_DOORS, TORCH_HOOKS):
            if candidate in table:
                return table[candidate]
    if "profil" in name.lower():
        return "profiling (a profiler left on taxes every later torch call)"
    return None


def rules() -> list[str]:
    """What a candidate file may contain, in a few lines for the agent's brief (the checks
    themselves are the source of truth; this says enough that an honest kernel passes them)."""
    allowed = ", ".join(sorted(ALLOWED_MODULES - {"__future__"}))
    return [
        f"imports only from: {allowed}",
        "no library names that start with an underscore (your own `_helpers`, `self._cache` "
        f"are fine; allowed: {', '.join(sorted(PRIVATE_ALLOWED))})",
        "a module is only the root of an attribute (`torch.empty`), never a value passed around",
        "no generators that hold a `with` or a `finally`, no coroutines (`async`), no "
        "`__del__`, `__torch_function__`, `__torch_dispatch__`, class or copy hooks "
        "(`__subclasshook__`, `__reduce__`, ...), no `__enter__` by hand",
        "attributes are assigned only on your own objects (`self`, your classes and their "
        "instances); `getattr`/`hasattr` only with a literal name (for a dtype by name, use a "
        'dict such as `{"float32": torch.float32}`)',
        'a self-test under `if __name__ == "__main__":` is not checked (it never runs)',
        "no file or network I/O, threads, processes, streams, events, CUDA graphs of your own, "
        "profilers, torch modes or `torch.library`, environment reads, frame or gc access, "
        "`exec`/`eval`/`setattr`, `functools.update_wrapper` (`@functools.wraps(fn)` on your "
        "own function is fine), metaclasses, `torch.compiler` settings (`is_compiling()` is "
        "fine), numpy `as_strided` or array interfaces, Triton `knobs`",
        "on the CPU, Triton runs under its interpreter, and only the task's shipped Triton "
        "files run there: test a new Triton kernel on a GPU",
        "no call to the task's reference, its peers or the library op that implements it, "
        "under any name (a 1x1 convolution is a matrix product, native_layer_norm a norm, a "
        "categorical distribution's probs a softmax)",
    ]


def _private(name: str) -> bool:
    return name.startswith("_") and name not in PRIVATE_ALLOWED


def _normalised(name: str) -> str:
    """`RMSNorm`, `rmsnorm` and `rms_norm` are one op."""
    return name.lower().replace("_", "")


def expand_forbidden_ops(forbidden_ops: tuple[str, ...]) -> tuple[str, ...]:
    """A task's FORBIDDEN_OPS with each family (LIBRARY_OPS) replaced by its ops."""
    return tuple(expanded for op in forbidden_ops for expanded in LIBRARY_OPS.get(op, (op,)))


def _names_op(name: str, ops: set[str], library: bool = True) -> bool:
    """Whether `name` is one of the normalised `ops`, or, where it is a library's (imported, or
    reached from a module), holds one of LONG_OP letters or more. An attribute of anything else
    (a tensor's method, the candidate's compiled extension) must be the op itself."""
    name = _normalised(name)
    return name in ops or (library and any(len(op) >= LONG_OP and op in name for op in ops))


def _foreign_dot(name: str, top: str | None) -> bool:
    """A dot product (LIBRARY_DOTS) from anywhere but Triton (`top`: the package the name is
    reached from, None for a value's attribute), whose tl.dot is the kernel's own."""
    return name in LIBRARY_DOTS and top != "triton"


def _module_attribute(node: ast.Attribute, module_names: set[str]) -> bool:
    """Whether `node` is a module's attribute (torch.nn.functional.conv1d), not one of a value a
    call returned (the candidate's compiled extension, a tensor)."""
    value = node.value
    while isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name) and value.id in module_names


def _op_module_reasons(module: str, lineno: int, ops: set[str]) -> list[Reason]:
    """An import from a module named for a forbidden op (torch.distributions.utils, say)."""
    parts = [part for part in module.split(".") if _names_op(part, ops)]
    return [
        reason("calls-reference", f"line {lineno}: imports from {module} ({part})")
        for part in parts[:1]
    ]


def declares_strided_inputs(module) -> bool:
    """Whether a loaded candidate module declares STRIDED_INPUTS (read from its namespace, not
    through a module `__getattr__`): decoder blocks then pass it views, and the evaluator
    verifies it on views too."""
    return module.__dict__.get("STRIDED_INPUTS") is True


def check_source(source: str, filename: str, forbidden_ops: tuple[str, ...] = ()) -> StaticReport:
    """All static reasons to reject `source`; an empty list means it may be loaded.
    `forbidden_ops` may name families of LIBRARY_OPS."""
    dots = LIBRARY_GEMM in forbidden_ops
    forbidden_ops = expand_forbidden_ops(forbidden_ops)
    try:
        tree = parse(source, filename)
    except SyntaxError as exc:
        return StaticReport(None, [reason("syntax-error", f"{filename}:{exc.lineno}: {exc.msg}")])

    reasons: list[Reason] = _type_comments(source)
    # A self-test under `if __name__ == "__main__":` never runs: the worker imports the file
    # under another name (which the file may not rebind).
    tree = without_self_tests(tree)
    ops = {_normalised(op) for op in forbidden_ops}
    parents = _parents(tree)
    jitted_nodes: set[ast.AST] = set()  # filled once the imports are known
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[(alias.asname or alias.name).split(".")[0]] = top
                if top not in ALLOWED_MODULES:
                    reasons.append(
                        reason("forbidden-import", f"line {node.lineno}: import {alias.name}")
                    )
                reasons += _module_path_reasons(alias.name, node.lineno)
                reasons += _op_module_reasons(alias.name, node.lineno, ops)
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level or top not in ALLOWED_MODULES:
                reasons.append(
                    reason("forbidden-import", f"line {node.lineno}: from {node.module} import")
                )
            reasons += _module_path_reasons(
                node.module or "", node.lineno, tuple(a.name for a in node.names)
            )
            reasons += _op_module_reasons(node.module or "", node.lineno, ops)
            module_parts = set((node.module or "").split("."))
            for alias in node.names:
                aliases[alias.asname or alias.name] = top
                why = banned_attribute(alias.name)
                if alias.name == "*":
                    reasons.append(reason("forbidden-import", f"line {node.lineno}: star import"))
                elif top == "cupy" and (alias.name in CUPY_RAW or module_parts & CUPY_RAW):
                    reasons.append(
                        reason("forbidden-call", f"line {node.lineno}: cupy raw CUDA bindings")
                    )
                elif _names_op(alias.name, ops) or (dots and _foreign_dot(alias.name, top)):
                    reasons.append(
                        reason("calls-reference", f"line {node.lineno}: imports {alias.name}")
                    )
                elif why is not None and top != "__future__":
                    reasons.append(
                        reason(
                            "forbidden-call", f"line {node.lineno}: imports {alias.name} ({why})"
                        )
                    )
                elif _private(alias.name):
                    reasons.append(
                        reason(
                            "forbidden-call",
                            f"line {node.lineno}: imports {alias.name} (private attribute)",
                        )
                    )

    module_names = set(aliases) | _module_aliases(tree, set(aliases))
    jitted_nodes = _inside_jitted(tree, aliases)
    reasons += _rebound_builtins(tree)
    reasons += _metaclasses(tree)
    parameters = _parameters(tree)
    bound = _bound_names(tree)
    own = _own_names(tree, module_names | parameters)
    own_roots = _own_roots(tree)
    module_state = _module_state(tree)
    reasons += _methods_through_their_class(tree)
    for node in (n for root in (tree, *_string_annotations(tree)) for n in ast.walk(root)):
        if type(node) in SUSPENDING and not _plain_generator_step(node, parents):
            reasons.append(
                reason("forbidden-call", f"line {node.lineno}: {SUSPENDING[type(node)]}")
            )
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            why_literal = _literal_getattr(node, parents)
            if why_literal == "":
                continue
            if why_literal is not None:
                reasons.append(reason("forbidden-call", f"line {node.lineno}: {why_literal}"))
                continue
            reasons.append(
                reason(
                    "forbidden-call",
                    f"line {node.lineno}: {node.id} ({FORBIDDEN_NAMES[node.id]})",
                )
            )
        elif isinstance(node, ast.Attribute):
            root = _root_name(node)
            why = banned_attribute(node.attr)
            if (
                node.attr in CUPY_RAW
                and aliases.get(root or "") == "cupy"
                and not _cupy_query(node, parents)
            ):
                reasons.append(
                    reason("forbidden-call", f"line {node.lineno}: {_dotted(node)} (raw CUDA)")
                )
            elif node.attr in READABLE_DUNDERS and isinstance(node.ctx, ast.Load):
                pass
            elif (
                why is not None
                and node.attr in own
                and own_roots.holds(node.value)
                and not node.attr.startswith("__")
            ):
                pass  # `self.stream`, `cfg.reduction`: the candidate's own field, named alike
            elif why is not None and _allowed_use(node, parents, aliases):
                pass
            elif why is not None:
                reasons.append(
                    reason("forbidden-call", f"line {node.lineno}: .{node.attr} ({why})")
                )
            elif (
                node.attr == "load"
                and aliases.get(root or "") not in LOAD_ALLOWED_ROOTS
                and not _owned(node, own, own_roots)
                and not (node in jitted_nodes and _root_name(node) not in module_names)
            ):
                reasons.append(
                    reason("forbidden-call", f"line {node.lineno}: {_dotted(node)} (file I/O)")
                )
            elif _private(node.attr) and not _owned(node, own, own_roots):
                reasons.append(
                    reason(
                        "forbidden-call",
                        f"line {node.lineno}: .{node.attr} (private attribute the candidate"
                        " does not define)",
                    )
                )
            elif (
                _names_op(node.attr, ops, _module_attribute(node, module_names))
                or (dots and _foreign_dot(node.attr, aliases.get(root or "")))
            ) and not (node.attr in bound and own_roots.holds(node.value)):
                reasons.append(
                    reason(
                        "calls-reference",
                        f"line {node.lineno}: .{node.attr} is a library op implementing the task",
                    )
                )
        elif (
            isinstance(node, ast.Name)
            and node.id.startswith("__")
            and node.id not in bound | SAFE_MODULE_DUNDERS
        ):
            reasons.append(
                reason("forbidden-call", f"line {node.lineno}: {node.id} (private module name)")
            )
        elif isinstance(node, ast.Name) and _names_op(node.id, ops) and node.id not in bound:
            reasons.append(
                reason("calls-reference", f"line {node.lineno}: {node.id} implements the task")
            )
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in HOOK_METHODS:
            reasons.append(
                reason(
                    "forbidden-call",
                    f"line {node.lineno}: defines {node.name} ({banned_attribute(node.name)})",
                )
            )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in NAMED_IN_STRINGS
        ):
            reasons.append(
                reason("forbidden-call", f"line {node.lineno}: names {node.value} in a string")
            )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "type"
            and len(node.args) + len(node.keywords) > 1
        ):
            reasons.append(reason("forbidden-call", f"line {node.lineno}: type() building a class"))
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        for target in targets:
            for sub in _stored_attributes(target):
                if sub.attr in HOOK_METHODS:
                    reasons.append(
                        reason("forbidden-call", f"line {sub.lineno}: assigns {_dotted(sub)}")
                    )
                elif not own_roots.holds(_root_node(sub)) and sub.attr not in KERNEL_SETTINGS:
                    reasons.append(
                        reason(
                            "foreign-attribute-assignment",
                            f"line {sub.lineno}: assigns {_dotted(sub)} (only attributes of "
                            "the candidate's own objects may be assigned)",
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
            wrong = [n for n in node.names if n not in module_state]
            if wrong:
                reasons.append(
                    reason(
                        "forbidden-call",
                        f"line {node.lineno}: global {', '.join(wrong)} (only the file's own "
                        "module-level state, not kernel, LANGUAGE, PARAMS or dunders)",
                    )
                )

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
    reasons += _modules_as_values(tree)
    reasons += _module_chains_as_values(tree)
    return StaticReport(language, _dedupe(reasons))


def _own_names(tree: ast.Module, foreign_roots: set[str]) -> set[str]:
    """Attribute names the candidate defines itself: its functions and classes, what its class
    bodies bind, and attributes it assigns on its own objects (`self._cache = {}`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                for target in _targets(stmt):
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        for target in _targets(node):
            for sub in _stored_attributes(target):
                if _root_name(sub) not in foreign_roots:
                    names.add(sub.attr)
    return names


# Read-only queries of CuPy's runtime bindings (the rest can set limits and stream attributes).
CUPY_QUERIES = {
    "getDevice",
    "getDeviceCount",
    "getDeviceProperties",
    "deviceGetAttribute",
    "runtimeGetVersion",
    "driverGetVersion",
}


def _cupy_query(node: ast.Attribute, parents: dict) -> bool:
    """`cupy.cuda.runtime.getDeviceProperties(...)`: a query, not a setting."""
    parent = parents.get(node)
    return (
        node.attr == "runtime" and isinstance(parent, ast.Attribute) and parent.attr in CUPY_QUERIES
    )


def _torch_stream(node: ast.Attribute, parents: dict) -> bool:
    """`cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)`: CuPy launching on
    torch's current stream (the one being captured), not a stream of the candidate's own."""
    call = parents.get(node)
    if not (isinstance(call, ast.Call) and call.func is node and len(call.args) == 1):
        return False
    arg = call.args[0]
    return (
        isinstance(arg, ast.Attribute)
        and arg.attr == "cuda_stream"
        and isinstance(arg.value, ast.Call)
        and _dotted(arg.value.func).endswith("cuda.current_stream")
    )


def _module_state(tree: ast.Module) -> set[str]:
    """Names a `global` statement may rebind: assigned at the file's top level, and not what
    the harness reads (kernel, LANGUAGE, PARAMS) or a dunder."""
    names = set()
    for stmt in tree.body:
        for target in _targets(stmt):
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return {n for n in names if not n.startswith("__")} - {"kernel", "LANGUAGE", "PARAMS"}


def _methods_through_their_class(tree: ast.Module) -> list[Reason]:
    """A method that can be called with anything as `self` (a module included) would let the
    candidate's own attribute names reach that thing's. So the candidate's classes are only
    instantiated, subclassed, named in isinstance checks and annotations, or have attributes
    other than plain methods read through them; `type(x)` gives no attribute but its name; and
    `getattr` with a literal is held to the same."""
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    plain: dict[str, set[str]] = {}
    out = []
    for name, cls in classes.items():
        defs = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        plain[name] = {
            f.name
            for f in cls.body
            if isinstance(f, ast.FunctionDef)
            and not any(_dotted(d) in {"staticmethod", "classmethod"} for d in f.decorator_list)
        }
        # `peek = go`, `table = (go,)` in the class body: a method under another name or in a
        # container is a method read through the class
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
                continue
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in defs:
                    out.append(
                        reason("forbidden-call", f"line {n.lineno}: {n.id} (a method as a value)")
                    )
    changed = True
    while changed:  # methods inherited from the candidate's own base classes
        changed = False
        for name, cls in classes.items():
            for base in cls.bases:
                extra = plain.get(_dotted(base), set()) - plain[name]
                if extra:
                    plain[name] |= extra
                    changed = True
    parents = _parents(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and _dotted(node.func) == "type"
            and len(node.args) == 1
            and not _type_read(node, parents.get(node))
        ):
            out.append(
                reason("forbidden-call", f"line {node.lineno}: type(...) kept (a class as a value)")
            )
        if isinstance(node, ast.Name) and node.id in classes and isinstance(node.ctx, ast.Load):
            why = _class_use(node, parents.get(node), plain[node.id], parents)
            if why:
                out.append(reason("forbidden-call", f"line {node.lineno}: {node.id} {why}"))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Call)
            and _dotted(node.value.func) == "type"
            and node.attr not in READABLE_DUNDERS
        ):
            out.append(
                reason(
                    "forbidden-call",
                    f"line {node.lineno}: type(...).{node.attr} (a class's method)",
                )
            )
    return out


def _type_read(node: ast.Call, parent: ast.AST | None) -> bool:
    """`type(x).__name__` or `type(a) is type(b)`: the class looked at, not kept."""
    if isinstance(parent, ast.Attribute):
        return parent.attr in READABLE_DUNDERS
    return isinstance(parent, ast.Compare)


def _class_use(node: ast.Name, parent: ast.AST | None, methods: set[str], parents: dict) -> str:
    """Why this use of one of the candidate's classes is not allowed ("" when it is)."""
    if isinstance(parent, ast.Call) and parent.func is node:
        return ""  # instantiation
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return f"{parent.attr} (a method read through its class)" if parent.attr in methods else ""
    if isinstance(parent, ast.ClassDef) and node in parent.bases:
        return ""
    if isinstance(parent, ast.arg | ast.AnnAssign | ast.FunctionDef):
        return ""  # an annotation
    holder = parents.get(parent) if isinstance(parent, ast.Tuple) else parent
    if (
        isinstance(holder, ast.Call)
        and _dotted(holder.func) in {"isinstance", "issubclass"}
        and len(holder.args) == 2
        and (holder.args[1] is node or holder.args[1] is parent)
    ):
        return ""
    if _plain_annotation(node, parents):
        return ""  # Optional[Box], Box | None, dict[str, Box], tuple[Box, ...]
    return "used as a value (its methods could then be called with anything as self)"


def _plain_annotation(node: ast.AST, parents: dict) -> bool:
    """`node` sits in an annotation through subscripts, tuples, lists and `|` only (no call)."""
    while isinstance(parents.get(node), ast.Subscript | ast.Tuple | ast.List | ast.BinOp):
        parent = parents[node]
        if isinstance(parent, ast.BinOp) and not isinstance(parent.op, ast.BitOr):
            return False
        node = parent
    parent = parents.get(node)
    return (isinstance(parent, ast.arg | ast.AnnAssign) and parent.annotation is node) or (
        isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) and parent.returns is node
    )


# Builtins the checks take at their word (getattr with a literal, hasattr as a feature check,
# type(...) with one argument): the file may not bind these names to something of its own.
TRUSTED_BUILTINS = {"getattr", "hasattr", "type", "isinstance", "super", "__name__"}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Each node's parent (the syntax tree keeps only children)."""
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _rebound_builtins(tree: ast.Module) -> list[Reason]:
    """Any binding, in any syntax, of a name the checks trust or ban as a builtin, or of a hook
    or class-identity name (`for __module__ in ...` in a class body binds it too)."""
    builtins = TRUSTED_BUILTINS | set(FORBIDDEN_NAMES)
    watched = builtins | set(CLASS_BODY_BANNED)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            # a method named after a hook is reported as defining it
            names = [node.name] if node.name not in HOOK_METHODS else []
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.split(".")[0]]
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names = [node.name]
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names = [node.rest]
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names = list(node.names)
        found += [(getattr(node, "lineno", 0), n) for n in names if n in watched]
    return [
        reason("forbidden-call", f"line {line}: binds {name}" + _why(banned_attribute(name)))
        for line, name in found
    ]


def _why(text: str | None) -> str:
    """` (why)` after a reason's subject, or nothing."""
    return f" ({text})" if text else ""


def without_self_tests(tree: ast.Module) -> ast.Module:
    """`tree` without its top-level `if __name__ == "__main__":` blocks: what the guard checks,
    and what the worker runs (it compiles this tree, not the file, so a block that would run
    after all, however `__name__` got rebound, is not there to run)."""
    tree.body = [n for n in tree.body if not _is_main_block(n)]
    return tree


def _is_main_block(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` at the top level."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _literal_getattr(node: ast.Name, parents: dict) -> str | None:
    """For `getattr`/`hasattr` called with a string literal as the name: "" when that is a
    plain attribute read the guard would allow, else why not; None when it is not such a call
    (a dynamic name stays banned)."""
    call = parents.get(node)
    if not (
        node.id in {"getattr", "hasattr"}
        and isinstance(call, ast.Call)
        and call.func is node
        and 2 <= len(call.args) <= 3
        and not call.keywords
        and isinstance(call.args[1], ast.Constant)
        and isinstance(call.args[1].value, str)
    ):
        return None
    name = call.args[1].value
    why = banned_attribute(name)
    if why is not None:
        return f"{node.id}(..., {name!r}) ({why})"
    if _private(name) and name not in READABLE_DUNDERS:
        return f"{node.id}(..., {name!r}) (private attribute)"
    return ""


def _plain_generator_step(node: ast.AST, parents: dict) -> bool:
    """A `yield` in a function that holds no context and no `try`: closing it late runs nothing
    (async code is never plain)."""
    if not isinstance(node, ast.Yield | ast.YieldFrom):
        return False
    func = parents.get(node)
    while func is not None and not isinstance(func, ast.FunctionDef | ast.Lambda):
        func = parents.get(func)
    if not isinstance(func, ast.FunctionDef):
        return False
    return not any(
        # an `except GeneratorExit` (or a bare except) runs at close, like a finally
        isinstance(n, ast.With | ast.AsyncWith | ast.Try | ast.TryStar)
        for n in ast.walk(func)
    )


def _inside_jitted(tree: ast.Module, aliases: dict[str, str]) -> set[ast.AST]:
    """Every node inside a function decorated by Triton's own `jit`, `autotune` or
    `heuristics` (not a `jit` of the file's own): device code, where `.load` on a parameter or
    local is a tensor descriptor's, not a file's."""
    inside: set[ast.AST] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            name = _dotted(dec.func if isinstance(dec, ast.Call) else dec)
            parts = name.split(".")
            if parts[-1] in {"jit", "autotune", "heuristics"} and aliases.get(parts[0]) == "triton":
                inside.update(ast.walk(node))
    return inside


@dataclass(frozen=True)
class _OwnRoots:
    """Roots whose attributes are the candidate's own: its classes and functions, names bound
    only ever to instances of its classes, and the `self`/`cls` parameter of its methods (the
    very name nodes: a `self` parameter of a plain function, or a rebound one, is not)."""

    names: frozenset[str]
    selves: frozenset[int]  # id() of the Name nodes that are a method's own first parameter
    classes: frozenset[str]
    # id() of a `super()` call -> what the one base it reaches defines in its own body, when
    # that base is one of the candidate's classes (found there before any library class)
    supers: dict[int, frozenset[str]]

    def holds(self, node: ast.AST | None) -> bool:
        if isinstance(node, ast.Call):  # a fresh instance, `Cache().load(k)`, or `super()`
            return isinstance(node.func, ast.Name) and (
                node.func.id in self.classes or node.func.id == "super"
            )
        if not isinstance(node, ast.Name):
            return False
        return id(node) in self.selves or node.id in self.names


def _own_roots(tree: ast.Module) -> _OwnRoots:
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    names = classes | {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    stores: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    stores.setdefault(t.id, []).append(node.value)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores.setdefault(node.id, []).append(None)  # counted below as "not a call"
        elif isinstance(node, ast.arg):
            stores.setdefault(node.arg, []).append(None)
    for name, values in stores.items():
        calls = [v for v in values if v is not None]
        plain_stores = [v for v in values if v is None]
        # every binding is `name = OwnClass(...)` (an Assign's target also appears as a Store)
        if (
            calls
            and len(plain_stores) == len(calls)
            and all(
                isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in classes
                for v in calls
            )
        ):
            names.add(name)
    selves: set[int] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for method in cls.body:
            if not isinstance(method, ast.FunctionDef) or not method.args.args:
                continue
            if method.decorator_list:  # a decorator may call it with anything as self
                continue
            first = method.args.args[0].arg
            inner = [n for n in ast.walk(method) if isinstance(n, ast.Name) and n.id == first]
            rebinding = any(not isinstance(n.ctx, ast.Load) for n in inner)
            shadowed = any(
                isinstance(n, ast.FunctionDef | ast.Lambda) and n is not method
                for n in ast.walk(method)
            )
            if not rebinding and not shadowed:
                selves.update(id(n) for n in inner)
    return _OwnRoots(frozenset(names), frozenset(selves), frozenset(classes), _supers(tree))


def _supers(tree: ast.Module) -> dict[int, frozenset[str]]:
    """For each `super()` in a class with exactly one base, a class of the file's own: the
    names that base defines in its body (`super()._block` then is the file's own `_block`)."""
    bodies = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    out: dict[int, frozenset[str]] = {}
    for cls in bodies.values():
        if len(cls.bases) != 1 or cls.keywords or not isinstance(cls.bases[0], ast.Name):
            continue
        base = bodies.get(cls.bases[0].id)
        if base is None:
            continue
        defined = frozenset(
            name
            for stmt in base.body
            for name in (
                [stmt.name]
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
                else [t.id for t in _targets(stmt) if isinstance(t, ast.Name)]
            )
        )
        for node in ast.walk(cls):
            if _super_call(node) and not node.args:
                out[id(node)] = defined
    return out


def _super_call(node: ast.AST) -> bool:
    """`node` is a call of `super`."""
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _root_node(node: ast.AST) -> ast.AST:
    """The expression at the bottom of an attribute and subscript chain (not through calls)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _owned(node: ast.Attribute, own: set[str], roots: _OwnRoots) -> bool:
    """`node` names an attribute the candidate defines, read straight from one of its own
    objects (`self._cache`, `Box._table`; not `w._module` of a library object `w`). Through
    `super()` only dunders (`super().__init__`): a private name there is the library base
    class's (`super()._convert_` of enum's metaclass writes into any module)."""
    value = node.value
    if _super_call(value) and not (node.attr.startswith("__") and node.attr.endswith("__")):
        return node.attr in roots.supers.get(id(value), frozenset())
    return node.attr in own and roots.holds(value)


METACLASS_BASES = {"type", "EnumMeta", "EnumType", "ABCMeta"}


def _metaclasses(tree: ast.Module) -> list[Reason]:
    """A class of the candidate's that derives from a metaclass: instantiating it builds classes
    through library hooks that write into other modules (enum's `_convert_`, `_simple=True`)."""
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for base in cls.bases:
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if name in METACLASS_BASES:
                out.append(
                    reason("forbidden-call", f"line {cls.lineno}: {cls.name} is a metaclass")
                )
    return out


def _imported_modules(tree: ast.Module) -> set[str]:
    """Names the candidate's imports bind to modules: every `import x` (as y), and each
    `from p import m` where p.m is a module."""
    plain = {
        (a.asname or a.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
    }
    return {name for name, path in _import_paths(tree).items() if name in plain or _is_module(path)}


def _import_paths(tree: ast.Module) -> dict[str, str]:
    """What each imported name stands for: `import a.b as x` -> x: "a.b"; `import a.b` -> a: "a";
    `from a import b as y` -> y: "a.b"."""
    paths: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                paths[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                paths[a.asname or a.name] = f"{node.module}.{a.name}"
    return paths


@functools.cache
def _is_module(dotted: str) -> bool:
    """Whether `dotted` (an allowed package's attribute chain) is a module, by looking it up
    in this process: `torch.nn.functional` is one, and so is `torch.nn.functional.torch`, a
    module re-exported under another module's name."""
    top, *rest = dotted.split(".")
    if top not in ALLOWED_MODULES:
        return False
    try:
        obj = importlib.import_module(top)
        for part in rest:
            obj = getattr(obj, part)
    except Exception:  # not there (or it fails to load): not a module value to worry about
        return False
    return isinstance(obj, types.ModuleType)


def _module_chains_as_values(tree: ast.Module) -> list[Reason]:
    """An attribute chain that is a module (`torch.nn.functional`, `torch.cuda`) used as a
    value, not as the root of a longer chain: it could be passed as `self` to a method whose
    own field names then reach the module's (`self.os`, `self.rms_norm`)."""
    paths = _import_paths(tree)
    parents = _parents(tree)
    out = []
    for node in ast.walk(tree):
        # getattr(torch, "cuda") is torch.cuda (a feature check's default aside)
        if (
            isinstance(node, ast.Call)
            and _dotted(node.func) == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = _dotted(node.args[0])
            root, *rest = base.split(".") if base else [""]
            if root in paths and _is_module(".".join([paths[root], *rest, node.args[1].value])):
                out.append(
                    reason(
                        "forbidden-call",
                        f"line {node.lineno}: getattr(..., {node.args[1].value!r}) is a module",
                    )
                )
            continue
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue
        root, *rest = _dotted(node).split(".")
        if root not in paths or not rest or _feature_check(node, parent):
            continue
        if _is_module(".".join([paths[root], *rest])):
            out.append(
                reason(
                    "forbidden-call",
                    f"line {node.lineno}: the module {_dotted(node)} used as a value (import it "
                    "under a name instead: `import torch.nn.functional as F`)",
                )
            )
    return out


def _modules_as_values(tree: ast.Module) -> list[Reason]:
    """A module may only be the root of an attribute chain (`torch.empty`), never a value
    passed around: a function that receives one as `self` or a parameter reaches its private
    names under cover of the candidate's own names (`A.go(dataclasses)` with `go` returning
    `self._create_fn(...)`)."""
    modules = _imported_modules(tree)
    parents = _parents(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id in modules):
            continue
        if not isinstance(node.ctx, ast.Load):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue
        if _feature_check(node, parent):
            continue
        out.append(
            reason(
                "forbidden-call",
                f"line {node.lineno}: the module {node.id} used as a value, not as the root of an "
                "attribute",
            )
        )
    return out


def _feature_check(node: ast.expr, parent: ast.AST | None) -> bool:
    """`hasattr(tl, "name")`, `getattr(torch, "float8_e4m3fn", None)`, `libdevice is None`:
    a module looked at, not handed to anything."""
    if isinstance(parent, ast.Compare):
        return all(isinstance(op, ast.Is | ast.IsNot) for op in parent.ops)
    return (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id in {"getattr", "hasattr"}
        and len(parent.args) >= 2
        and parent.args[0] is node
        and isinstance(parent.args[1], ast.Constant)
        and isinstance(parent.args[1].value, str)
    )


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


def _stored_attributes(target: ast.AST) -> list[ast.Attribute]:
    """The attributes an assignment target writes into: `a.b = `, `a.b[k] = `, `a.b.c[k][j] = `,
    in tuples too; not the attributes read in a subscript's index (`cache[x.shape] = `)."""
    if isinstance(target, ast.Tuple | ast.List):
        return [a for elt in target.elts for a in _stored_attributes(elt)]
    if isinstance(target, ast.Starred):
        return _stored_attributes(target.value)
    found = []
    while isinstance(target, ast.Attribute | ast.Subscript):
        if isinstance(target, ast.Attribute):
            found.append(target)
        target = target.value
    return found


def _allowed_use(node: ast.Attribute, parents: dict, aliases: dict[str, str]) -> bool:
    """Uses of a banned attribute name that do none of what it is banned for."""
    if node.attr == "ExternalStream":
        return _torch_stream(node, parents)
    if node.attr == "compiler":
        return _compiler_read(node, parents, aliases)
    if node.attr == "wraps":
        return _wraps_decorator(node, parents)
    return False


# What may be read under a `compiler` namespace: whether torch is compiling, the decorator that
# keeps dynamo out of the file's own function, and the compile errors to catch.
COMPILER_READS = {
    "torch.compiler": {"is_compiling", "is_dynamo_compiling", "is_exporting", "disable"},
    "triton.compiler.errors": {"CompilationError", "CompileTimeAssertionFailure"},
    "triton.compiler": {"errors"},
    "cupy.cuda.compiler": {"CompileException"},
}


def _compiler_read(node: ast.Attribute, parents: dict, aliases: dict[str, str]) -> bool:
    """`torch.compiler.is_compiling()`, `triton.compiler.errors.CompilationError`, ..."""
    parent = parents.get(node)
    root = _root_name(node)
    path = ".".join([aliases.get(root or "", root or ""), *_dotted(node).split(".")[1:]])
    return (
        isinstance(parent, ast.Attribute)
        and parent.value is node
        and parent.attr in COMPILER_READS.get(path, set())
    )


def _wraps_decorator(node: ast.Attribute, parents: dict) -> bool:
    """`@functools.wraps(fn)` on a function the file defines, with no `assigned`/`updated`: it
    writes only onto that new function."""
    call = parents.get(node)
    holder = parents.get(call)
    return (
        isinstance(call, ast.Call)
        and call.func is node
        and len(call.args) == 1
        and isinstance(call.args[0], ast.Name)
        and not call.keywords
        and isinstance(holder, ast.FunctionDef | ast.AsyncFunctionDef)
        and call in holder.decorator_list
    )


def _module_path_reasons(module: str, lineno: int, names: tuple[str, ...] = ()) -> list[Reason]:
    """`import torch.utils._python_dispatch`, `from torch.overrides import ...`: a banned
    attribute is banned as a module path component too (`from torch.compiler import
    is_compiling` and the compile errors excepted)."""
    if names and set(names) <= COMPILER_READS.get(module, set()):
        return []
    out = []
    for part in module.split(".")[1:]:
        why = banned_attribute(part) or ("private module" if _private(part) else None)
        if why is not None:
            out.append(reason("forbidden-import", f"line {lineno}: {module} ({why})"))
    return out


def _bound_names(tree: ast.Module) -> set[str]:
    """Names the candidate defines itself: functions, classes, parameters, assigned names and
    the names it imports under."""
    names = _parameters(tree) | {"self", "cls"}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
    return names


def _string_annotations(tree: ast.Module) -> list[ast.AST]:
    """String annotations parsed as the code they are: typing.get_type_hints (which
    functools.singledispatch calls) and torch.jit evaluate them."""
    annotations: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    parsed: list[ast.AST] = []
    while annotations:
        for sub in ast.walk(annotations.pop()):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    expr = parse(sub.value.strip(), mode="eval")
                except SyntaxError:
                    continue
                for inner in ast.walk(expr):
                    if hasattr(inner, "lineno"):
                        inner.lineno = sub.lineno
                parsed.append(expr)
                annotations.append(expr.body)
    return parsed


def _type_comments(source: str) -> list[Reason]:
    """`# type:` comments are evaluated by torch.jit (arbitrary code the syntax tree never sees)."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and TYPE_COMMENT.match(tok.string):
                out.append(
                    reason("forbidden-call", f"line {tok.start[0]}: a type comment (evaluated)")
                )
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def _dedupe(reasons: list[Reason]) -> list[Reason]:
    seen: set[tuple[str, str]] = set()
    out = []
    for r in reasons:
        if (r.code, r.message) not in seen:
            seen.add((r.code, r.message))
            out.append(r)
    return out

"""Kernel tasks: find a task folder by name or path and load its `task.py` into a `Task`.

`kernels/` is a tree of folders loaded by path. From a source checkout it is the `kernels/` beside
the packages; from a wheel it is the copy shipped as `loop/_tasks`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

REQUIRED = ("SHAPES", "TOLERANCE", "make_inputs", "reference", "bytes_moved", "flops", "PEERS")


# One compiled wrapper per (task module, dynamic): torch.compile keys its cache on the wrapper,
# so a new wrapper for every lookup would compile every shape again.
_COMPILED: dict[tuple[str, bool], Callable] = {}


def compiled_eager(module: ModuleType, dynamic: bool) -> Callable:
    """`module.eager` under torch.compile, compiled on its first call (importing dynamo takes
    seconds, so a run without compiled peers never pays for it)."""
    key = (module.__name__, dynamic)
    if key not in _COMPILED:
        state: dict[str, Callable] = {}

        def run(*inputs):
            if "fn" not in state:
                import torch

                state["fn"] = torch.compile(module.eager, dynamic=dynamic)
            return state["fn"](*inputs)

        _COMPILED[key] = run
    return _COMPILED[key]


class TaskError(Exception):
    """A task that cannot be found or does not follow the task contract."""


@dataclass(frozen=True)
class Shape:
    name: str
    dims: dict
    dtype: str
    weight: float
    shape_class: str
    seed: int

    def to_dict(self) -> dict:
        return dict(self.dims)


@dataclass
class Task:
    name: str
    folder: Path
    module: ModuleType
    candidates: dict[str, list[str]] = field(default_factory=dict)
    # Bound when the task loads, before any candidate: patching the module later changes nothing.
    _reference: Callable | None = None
    _make_inputs: Callable | None = None

    def __post_init__(self) -> None:
        self._reference = self.module.reference
        self._make_inputs = self.module.make_inputs

    def shapes(self, device: str) -> list[Shape]:
        key = "cuda" if device.startswith("cuda") else "cpu"
        shapes = self.module.SHAPES[key]
        return [
            Shape(
                name=s["name"],
                dims=dict(s),
                dtype=s["dtype"],
                weight=float(s.get("weight", 1.0)),
                shape_class=s.get("class", "default"),
                seed=public_seed(self.name, s["name"]),
            )
            for s in shapes
        ]

    def tolerance(self, dtype: str, peer: bool = False) -> float:
        """The largest relative error a candidate may have in `dtype`; for a peer, the task's
        optional `PEER_TOLERANCE` where it names the dtype (a peer is the ecosystem's code as it
        ships: it is timed, and its error reported, if it is within that)."""
        if peer and dtype in getattr(self.module, "PEER_TOLERANCE", {}):
            return float(self.module.PEER_TOLERANCE[dtype])
        return float(self.module.TOLERANCE[dtype])

    def ragged_twin(self, shape: Shape, draw: int) -> Shape | None:
        """`shape` with 1 to the task's optional RAGGED_TAIL more on its bucket key (at most the
        key itself: the twin costs at most twice the shape), chosen by `draw` (secret: a kernel
        cannot be right at known lengths only), where candidates are verified too, never timed:
        the dispatch table serves every length from one bucket to the next, not only the shapes'
        own. None where the task has no tail, or the bucket is above its optional RAGGED_UP_TO
        (a float64 reference of a long prefill costs as much as the shape's own)."""
        tail, key = getattr(self.module, "RAGGED_TAIL", None), self.bucket_key
        if not tail or key is None:
            return None
        if shape.dims[key] > getattr(self.module, "RAGGED_UP_TO", float("inf")):
            return None
        extra = 1 + draw % max(1, min(tail, shape.dims[key]))
        name = f"{shape.name}+{extra}"
        return Shape(
            name=name,
            dims={**shape.dims, key: shape.dims[key] + extra, "name": name},
            dtype=shape.dtype,
            weight=shape.weight,
            shape_class=shape.shape_class,
            seed=public_seed(self.name, name),
        )

    @property
    def row_error_ord(self) -> int | None:
        """The task's optional ROW_ERROR_ORD: each output row's (last dim's) relative error in
        that norm must be within the tolerance too, not only the whole output's."""
        return getattr(self.module, "ROW_ERROR_ORD", None)

    def output_dtypes(self, shape: Shape, count: int) -> list[str]:
        """The dtype of each of the `count` outputs: the task's optional `output_dtypes(shape)`
        hook, else the shape's dtype for every output."""
        hook = getattr(self.module, "output_dtypes", None)
        if hook is None:
            return [shape.dtype] * count
        dtypes = [str(d) for d in hook(shape.to_dict())]
        if len(dtypes) != count:
            raise TaskError(
                f"{self.name}: output_dtypes gives {len(dtypes)} dtypes for {count} outputs"
            )
        return dtypes

    def make_inputs(self, shape: Shape, seed: int, device: str) -> tuple:
        inputs = self._make_inputs(shape.to_dict(), seed, device)
        return tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)

    def reference(self, *inputs):
        return self._reference(*inputs)

    def bytes_moved(self, shape: Shape) -> int:
        return int(self.module.bytes_moved(shape.to_dict()))

    def flops(self, shape: Shape) -> int:
        return int(self.module.flops(shape.to_dict()))

    def declares_read_write(self) -> bool:
        """Whether the task gives bytes read and bytes written apart (`bytes_read` and
        `bytes_written` hooks), so its floor may use the read bandwidth."""
        return hasattr(self.module, "bytes_read") and hasattr(self.module, "bytes_written")

    def bytes_read_written(self, shape: Shape) -> tuple[int, int]:
        """(bytes read, bytes written); without the hooks, `bytes_moved` counts as copy traffic
        (half read, half written)."""
        if self.declares_read_write():
            dims = shape.to_dict()
            return int(self.module.bytes_read(dims)), int(self.module.bytes_written(dims))
        moved = self.bytes_moved(shape)
        return moved - moved // 2, moved // 2

    @property
    def peers(self) -> dict[str, Callable]:
        """The task's `PEERS`, then its `COMPILED_PEERS`: `eager` under torch.compile."""
        compiled = dict(getattr(self.module, "COMPILED_PEERS", {}))
        return {
            **self.module.PEERS,
            **{name: compiled_eager(self.module, dynamic) for name, dynamic in compiled.items()},
        }

    def peer_runs_on(self, name: str, device: str) -> bool:
        """Whether peer `name` runs on `device`: the task's optional `PEER_DEVICES` maps a peer
        to the device kinds it runs on (`{"sdpa-flash": ["cuda"]}`); unlisted peers run on all."""
        kinds = dict(getattr(self.module, "PEER_DEVICES", {})).get(name)
        key = "cuda" if device.startswith("cuda") else "cpu"
        return kinds is None or key in kinds

    def default_peers(self, device: str) -> list[str]:
        """Every peer that runs on the device; on the CPU all but torch.compile, which needs
        minutes of compilation per shape on a small machine (ask for it by name to have it)."""
        peers = [p for p in self.peers if self.peer_runs_on(p, device)]
        if device.startswith("cuda"):
            return peers
        return [p for p in peers if not p.startswith("torch.compile")]

    @property
    def bucket_key(self) -> str | None:
        return getattr(self.module, "BUCKET_KEY", None)

    @property
    def distributed(self) -> bool:
        """Whether the task's candidates run one process per GPU (its DISTRIBUTED): verified and
        timed by loop.distributed.run_distributed_task, not by the single-process evaluator."""
        return bool(getattr(self.module, "DISTRIBUTED", False))

    def candidate_paths(self, device: str) -> list[Path]:
        key = "cuda" if device.startswith("cuda") else "cpu"
        return [self.folder / name for name in self.candidates.get(key, [])]

    def file_hashes(self) -> dict[str, str]:
        """sha256 of every file of the task folder except candidates (the workspace lock)."""
        out = {}
        for path in sorted(self.folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out[str(path.relative_to(self.folder))] = hashlib.sha256(
                    path.read_bytes()
                ).hexdigest()
        return out


def public_seed(task: str, shape: str) -> int:
    digest = hashlib.sha256(f"{task}/{shape}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def kernels_root() -> Path:
    """The folder holding the task folders (source checkout first, then the wheel's copy)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "kernels", here / "_tasks"):
        if candidate.is_dir():
            return candidate
    raise TaskError(f"no kernels folder found beside {here}")


# What `autotune run` tunes unless told otherwise (`--task all` runs every task): the one task
# whose whole loop fits the run's default budget on a 2-core CPU and on a GPU.
DEFAULT_TASKS = ("rmsnorm",)


def available_tasks() -> list[str]:
    root = kernels_root()
    return sorted(p.name for p in root.iterdir() if (p / "task.py").is_file())


def resolve_task_folder(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.is_dir():
        if not (path / "task.py").is_file():
            raise TaskError(f"{path} has no task.py: not a task folder")
        return path.resolve()
    if path.name == "task.py" and path.is_file():
        return path.parent.resolve()
    folder = kernels_root() / str(name_or_path)
    if (folder / "task.py").is_file():
        return folder.resolve()
    known = ", ".join(available_tasks()) or "none"
    raise TaskError(
        f"unknown task {str(name_or_path)!r}: known tasks are {known}, or give a folder"
    )


def load_task(name_or_path: str | Path) -> Task:
    folder = resolve_task_folder(name_or_path)
    module_name = (
        f"autotune_task_{folder.name}_{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}"
    )
    if module_name in sys.modules:
        module = sys.modules[module_name]
    else:
        spec = importlib.util.spec_from_file_location(module_name, folder / "task.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # a broken task file is reported, not raised as a traceback
            raise TaskError(f"{folder / 'task.py'} failed to load: {exc!r}") from exc
        sys.modules[module_name] = module
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise TaskError(f"{folder / 'task.py'} lacks {', '.join(missing)} (task contract)")
    return Task(
        name=folder.name,
        folder=folder,
        module=module,
        candidates=dict(getattr(module, "CANDIDATES", {})),
    )

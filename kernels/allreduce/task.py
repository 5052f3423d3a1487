"""All-reduce (sum) across the ranks of one host, one process per GPU: every rank ends with the
sum of every rank's tensor, in its own dtype.

A distributed task: `loop.distributed` runs it, one process per rank, never the single-process
evaluator (`DISTRIBUTED = True`; `CANDIDATES` is empty for that evaluator, the rank harness
reads `DIST_CANDIDATES`). Each rank's input is `make_rank_input(shape, seed, rank, device)`;
any rank can rebuild every other rank's input from the seed, so the reference needs no
communication. For the single-process contract `make_inputs` gives all ranks' inputs stacked
(world, numel) and `reference` sums them in float64.

Distributed candidate contract (one file each): `LANGUAGE`, optional `PARAMS`, optional
`setup(comm, numel, dtype, **params) -> state` (collective, once per shape, outside graph
capture: allocate peer buffers there) and `kernel(x, state, **params) -> out`, called on every
rank with that rank's input, capturable in a CUDA graph. `comm` has rank, world_size, device,
backend and group. Message sizes are where latency dominates (4 KiB..64 MiB); the dispatch
table hands sizes where NCCL wins, and every size above the largest measured, back to NCCL.
"""

from __future__ import annotations

import torch

DISTRIBUTED = True
WORLD_SIZE_DEFAULT = 2

# Relative error norm against the float64 sum. NCCL reduces bf16 in bf16 hop by hop on a ring.
TOLERANCE = {"bfloat16": 1.6e-2, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

KiB, MiB = 2**10, 2**20
_GPU_BYTES = [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
_CPU_BYTES = [4 * KiB, 64 * KiB, 1 * MiB]
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def _class(nbytes: int) -> str:
    return "latency" if nbytes <= 64 * KiB else "middle" if nbytes <= 1 * MiB else "bandwidth"


_WEIGHT = {"latency": 3.0, "middle": 2.0, "bandwidth": 1.0}


def _shapes(sizes: list[int], dtypes: list[str]) -> list[dict]:
    return [
        {
            "name": f"{dtype}-{nbytes // KiB}KiB",
            "class": _class(nbytes),
            "bytes": nbytes,
            "numel": nbytes // _ITEMSIZE[dtype],
            "dtype": dtype,
            "weight": _WEIGHT[_class(nbytes)],
        }
        for dtype in dtypes
        for nbytes in sizes
    ]


SHAPES = {
    "cuda": _shapes(_GPU_BYTES, ["bfloat16", "float32"]),
    "cpu": _shapes(_CPU_BYTES, ["float32"]),
}
BUCKET_KEY = "bytes"


def make_rank_input(shape: dict, seed: int, rank: int, device: str) -> torch.Tensor:
    """Rank `rank`'s tensor: values of order one, different on every rank."""
    # the harness's seeds use 63 bits: keep the mix inside what a Generator takes
    gen = torch.Generator(device="cpu").manual_seed((seed * 1009 + rank) % (1 << 63))
    x = torch.randn(shape["numel"], generator=gen, dtype=torch.float32)
    return x.to(device=device, dtype=getattr(torch, shape["dtype"]))


def expected(shape: dict, seed: int, world_size: int, device: str) -> torch.Tensor:
    """The exact sum over all ranks (float64), rebuilt locally from the seed."""
    total = torch.zeros(shape["numel"], dtype=torch.float64, device=device)
    for rank in range(world_size):
        total += make_rank_input(shape, seed, rank, device).to(torch.float64)
    return total


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor]:
    """Single-process view: every rank's input stacked, (world, numel)."""
    world = int(shape.get("world_size", WORLD_SIZE_DEFAULT))
    rows = [make_rank_input(shape, seed, r, device) for r in range(world)]
    return (torch.stack(rows),)


def reference(stacked: torch.Tensor) -> torch.Tensor:
    return stacked.to(torch.float64).sum(dim=0)


def bytes_moved(shape: dict) -> int:
    """Bytes each rank reads and writes locally at the least (its input and its output)."""
    return 2 * shape["bytes"]


def flops(shape: dict) -> int:
    return shape["numel"]


def bus_bytes(shape: dict, world_size: int) -> float:
    """Bytes counted for bus bandwidth (nccl-tests): size x 2(n-1)/n."""
    return shape["bytes"] * 2 * (world_size - 1) / world_size


def nccl_setup(comm, numel: int, dtype: torch.dtype):
    return comm.group


def nccl(x: torch.Tensor, group) -> torch.Tensor:
    """The reference peer: torch.distributed.all_reduce (NCCL on GPUs, gloo on the CPU)."""
    out = x.clone()
    torch.distributed.all_reduce(out, group=group)
    return out


# Peers of the distributed harness: name -> (setup, kernel). The first is the baseline.
DIST_PEERS = {"nccl": (nccl_setup, nccl)}
PEERS = {}  # single-process peers: none (an all-reduce needs its ranks)

DIST_CANDIDATES = {
    "cuda": [
        "triton_one_shot.py",
        "triton_one_shot_epoch.py",
        "triton_two_shot.py",
        "torch_allgather_sum.py",
    ],
    "cpu": ["torch_allgather_sum.py"],
}
CANDIDATES: dict[str, list[str]] = {"cuda": [], "cpu": []}

FORBIDDEN_OPS = (
    "all_reduce",
    "allreduce",
    "one_shot_all_reduce",
    "two_shot_all_reduce_",
    "multimem_all_reduce_",
    "reduce_scatter",
    "reduce_scatter_tensor",
)

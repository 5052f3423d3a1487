"""GPU runs of the memory-bound tasks (rmsnorm, add_rmsnorm, softmax, cross_entropy, swiglu,
rope, skinny_gemm's CuPy GEMVs at M <= 16, the fused decode GEMVs rmsnorm_linear,
linear_residual, rmsnorm_linear_swiglu and rmsnorm_linear_rope, and MLA's per-head head_gemv, its
rope and latent norm (mla_rope_norm) and its attention with the value projection
(mla_decode_value), and Llama's decode attention with the output projection and its add
(gqa_decode_residual)):
an optional quick sweep that times a short list of each candidate's configurations at the
plan's first shape (one evaluator call per plan: verify, then interleaved CUDA-graph timing) and
keeps the fastest, then `autotune bench` of that configuration against the peers over the
plan's shapes. Writes one JSON file per step into
OUT_DIR and prints a summary line each.

    uv run python scripts/bench_tasks_gpu.py OUT_DIR [--sweep] [--no-bench] [--tasks a,b]
        [--candidates f.py,...] [--tags t,...] [--peer NAME ...] [--best-from EARLIER_DIR ...]
        [--e2e-shapes]

--sweep alone (with --no-bench) takes about 3-5 minutes of GPU time for all five tasks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass
class Plan:
    task: str
    candidate: str
    shapes: list[str]  # the first is the sweep shape
    configs: list[dict] = field(default_factory=list)
    tag: str = ""  # tells apart two plans of one candidate in the output file names
    peers: list[str] = field(default_factory=list)  # the bench's peers when --peer gives none
    # Other files' configurations timed in the same sweep, as its yardsticks (never its best)
    rivals: list[tuple[str, dict]] = field(default_factory=list)

    def stem(self, step: str) -> str:
        return "-".join(x for x in (step, self.task, Path(self.candidate).stem, self.tag) if x)


def _grid(axes: dict, *extra: dict) -> list[dict]:
    """The product of `axes` (name -> values), then the `extra` configurations."""
    out = [{}]
    for name, values in axes.items():
        out = [{**c, name: v} for c in out for v in values]
    return [*out, *extra]


# The Llama-3-8B projections the decoder blocks call (qkv, o, gate+up, down), and DeepSeek-V3's
# down projection, as N-K; the smallest first (the sweep shape), where cuBLAS is furthest from
# the copy bandwidth.
SKINNY_NK = ["n4096-k4096", "n6144-k4096", "n28672-k4096", "n4096-k14336", "n7168-k18432"]

# Softmax and cross-entropy: the large vocabularies at a long prefill, and a decode batch (the
# first is the sweep shape); the decode plans sweep at a decode batch.
VOCAB_SHAPES = [
    "prefill-8192x128256",
    "prefill-8192x32000",
    "prefill-8192x151936",
    "decode-64x128256",
]
VOCAB_DECODE_SHAPES = [
    "decode-64x128256",
    "decode-256x128256",
    "decode-64x151936",
    "decode-64x32000",
]
# The row-resident CuPy kernels' launch shapes: block size and the largest slice of a row a block
# holds.
RESIDENT_GRID = _grid({"threads": [128, 256, 512], "slice_kb": [16, 32, 64]})
# At decode batches (a few rows, one wave), 1024-thread blocks too: at 256 x 32000 one block of
# 1024 threads a row was the fastest cross-entropy launch (session 8, call 5).
RESIDENT_DECODE_GRID = _grid({"threads": [128, 256, 512, 1024], "slice_kb": [8, 16, 32, 64]})
# The resident cross-entropy's blocks meeting through global memory instead of a cluster
# (`exchange`), against the fastest cluster launches (session 9, call 1), in the same sweep.
GLOBAL_DECODE_GRID = _grid(
    {"threads": [256, 512, 1024], "slice_kb": [8, 16, 32], "exchange": ["global"]},
    {"threads": 256, "slice_kb": 8},
    {"threads": 512, "slice_kb": 16},
)
GLOBAL_PREFILL_GRID = _grid(
    {"threads": [256, 512], "slice_kb": [32, 64], "exchange": ["global"]},
    {"threads": 256, "slice_kb": 64},
)
# The resident softmax prefetching the next rows' slices into shared memory, against the best
# one-row-a-cluster launch of session 7 (listed first in each plan).
# Session 8's first sweep (call 2): one prefetched stage, 4 rows a cluster and 64 KiB slices (4
# blocks a row at 128256 columns) were best; two stages, 16 rows and 8-block clusters lost.
PIPELINED_GRID = _grid(
    {"threads": [128, 256, 512], "slice_kb": [64], "stages": [1], "rows_per_cluster": [2, 4, 8]}
) + _grid({"threads": [512, 1024], "slice_kb": [128], "stages": [1], "rows_per_cluster": [2, 4]})
# At 151936 columns a 64 KiB slice still takes 8 blocks; 128 KiB slices take 4.
PIPELINED_152K_GRID = _grid(
    {"threads": [256, 512, 1024], "slice_kb": [128], "stages": [1], "rows_per_cluster": [2, 4, 8]},
    {"threads": 128, "slice_kb": 64, "stages": 1, "rows_per_cluster": 2},
)
# The skinny GEMM's peers: no torch.compile, whose matmul is an extern cuBLAS call, and
# compiling every shape outran 150 s on the H200.
GEMV_PEERS = ["cublas", "eager"]
# The fused decode GEMVs' peers: the eager pair of ops, and torch.compile of it.
FUSED_PEERS = ["eager", "torch.compile"]
SPLITK_GRID = _grid({"per_lane": [2, 4, 8, 16], "n_per_block": [1, 2, 4]})
TRITON_GEMV_GRID = _grid({"per_lane": [1, 2, 4, 8], "block_n": [1, 2, 4]})
# The tensor-core ones at 16 rows: tile width, K step and slices (the last slice's program adds
# the partials and runs the epilogue).
TRITON_GEMM_GRID = _grid({"block_n": [64, 128], "block_k": [128, 256], "split_k": [1, 2, 4, 8]})
# Two W tiles a step (gate and up): 128 x 256 tiles need 279,552 B of shared memory at 3 stages,
# over the H200's 232,448 B a block (compiled for sm_90).
TRITON_GEMM_PAIR_GRID = [c for c in TRITON_GEMM_GRID if (c["block_n"], c["block_k"]) != (128, 256)]
# All but k_warps 16 with n_tiles 4, which the kernel refuses (its partial tiles' shared memory).
HEAD_GEMV_DOT_GRID = _grid({"block_n": [32, 64, 128], "block_k": [64, 128, 256]})
HEAD_GEMV_ROW_GRID = _grid(
    {"block_m": [1], "block_n": [16, 32, 64], "block_k": [128, 256], "use_dot": [False]}
)
# The MLA merges the tables run (session 47's): 16 sequences on tensor cores, one sequence in
# four column slices; the CUDA split kernel's 64-row build and its values_between loop.
MLA_MERGE16 = {"block_m": 16, "block_k": 128, "merge_warps": 8}
MLA_MERGE1 = {"block_k": 128, "column_slices": 4}
CUDA_MLA_ROWS64 = {"block_n": 64, "num_stages": 2}
CUDA_MLA_BETWEEN = {"values_between": True}
MMA_GRID = [
    c
    for c in _grid({"k_warps": [4, 8, 16], "n_tiles": [1, 2, 4], "unroll": [1, 2, 4]})
    if c["k_warps"] * c["n_tiles"] <= 32
]

# The streaming GEMVs: tile height and width, stages (tiles in flight + 1) and programs an SM;
# at long K (14k-18k) one 16k-wide tile a row (x held in registers) too, at short K (1.5k-7k)
# wider rows only (one or a few tiles a row).
STREAM_LONG_K = _grid(
    {
        "block_n": [1, 2, 4],
        "block_k": [2048, 4096],
        "num_stages": [3, 5],
        "programs_per_sm": [1, 2],
    },
    *_grid({"block_n": [1], "block_k": [16384], "num_stages": [3], "programs_per_sm": [1, 2]}),
)
STREAM_SHORT_K = _grid(
    {
        "block_n": [1, 2, 4, 8],
        "block_k": [2048, 8192],
        "num_stages": [3, 5],
        "programs_per_sm": [1, 2],
    }
)
STREAM_GEMVS = {
    "linear_residual": "triton_gemv_stream.py",
    "rmsnorm_linear": "triton_rmsnorm_gemv_stream.py",
}
# The fused GEMV tasks' CuPy and row-resident Triton candidates.
GEMVS = {
    "rmsnorm_linear": ("cupy_rmsnorm_gemv.py", "triton_rmsnorm_gemv.py"),
    "linear_residual": ("cupy_gemv_residual.py", "triton_gemv_residual.py"),
}


def _gluon_configs(rows: list[tuple], **fixed) -> list[dict]:
    """Gluon kernel configurations from (split_k, block_k, num_stages[, programs_per_sm]) rows,
    each with the `fixed` parameters."""
    names = ("split_k", "block_k", "num_stages", "programs_per_sm")
    return [dict(zip(names[: len(row)], row, strict=True)) | fixed for row in rows]


# The Gluon kernel (W through a deeper TMA ring from a loader warp of its own) at the b16
# blocks' four projections onto the residual stream, against the block tables' Triton
# configuration in the same sweep: rings of 100 KiB or 200 KiB (by shared memory two programs an
# SM or one; uncapped, the build's registers allow one).
GLUON_RESIDUAL_PLANS = [
    Plan(
        "linear_residual",
        "gluon_gemm_residual.py",
        [shape],
        _gluon_configs(
            [
                (split, block_k, stages)
                for split in splits
                for block_k, stages in ((128, 5), (128, 10), (64, 10), (64, 20))
            ],
            late_dependents=late,
        ),
        tag=tag,
        peers=FUSED_PEERS,
        rivals=[("triton_gemm_residual.py", table)],
    )
    for tag, shape, splits, late, table in [
        (
            "o16gluon",
            "m16-n4096-k4096",
            [1, 2, 4],
            True,
            {"block_n": 64, "block_k": 128, "split_k": 4, "late_dependents": True},
        ),
        (
            "down16gluon",
            "m16-n4096-k14336",
            [2, 4],
            True,
            {"block_n": 64, "block_k": 128, "split_k": 4, "late_dependents": True},
        ),
        (
            "o16mlagluon",
            "m16-n7168-k16384",
            [1, 2],
            False,
            {"block_n": 32, "block_k": 128, "split_k": 2, "num_warps": 2, "num_stages": 3},
        ),
        (
            "down16mlagluon",
            "m16-n7168-k18432",
            [1, 2],
            True,
            {
                "block_n": 32,
                "block_k": 128,
                "split_k": 4,
                "num_warps": 2,
                "num_stages": 3,
                "late_dependents": True,
            },
        ),
    ]
]
# The same four with shallower rings and wider steps (session 35's H100 sweeps: 5 stages of 128
# columns beat 10, and fewer slices beat more), against the same yardsticks.
GLUON_RESIDUAL_PLANS += [
    replace(
        plan,
        tag=f"{plan.tag}2",
        configs=[
            {**plan.configs[0], "split_k": split, "block_k": block_k, "num_stages": stages}
            for split in (1, 2)
            for block_k, stages in ((128, 3), (128, 4), (128, 6), (256, 2), (256, 3))
        ],
    )
    for plan in GLUON_RESIDUAL_PLANS
]
# The Triton configurations the block tables run where the Gluon RMSNorm + qkv + rope and
# RMSNorm + gate/up + SwiGLU (the x g kernels) are swept: their rivals in the same sweep.
QKV16_IN_FORCE = (
    "triton_rmsnorm_gemm_rope.py",
    {"block_n": 32, "block_k": 128, "split_k": 4, "x_ahead": True},
)
QKV1_IN_FORCE = ("triton_rmsnorm_gemv_rope.py", {"block_n": 2, "per_lane": 8})
O1_IN_FORCE = ("triton_gemv_residual.py", {"block_n": 2, "per_lane": 8})
GATEUP16_IN_FORCE = (
    "triton_rmsnorm_gemm_swiglu.py",
    {"block_n": 64, "block_k": 128, "split_k": 1, "x_ahead": True, "late_dependents": True},
)
# DeepSeek-V3's gate/up at 16 rows as session 14's bench timed the Triton kernel (0.968x of
# torch.compile there, so the tables run torch.compile's kernels): the yardstick of its sweeps.
GATEUP16MLA_BENCHED = (
    "triton_rmsnorm_gemm_swiglu.py",
    {"block_n": 64, "block_k": 128, "split_k": 2, "x_ahead": True},
)
X_G_KERNELS = {
    "rmsnorm_linear_rope": "gluon_rmsnorm_gemm_rope.py",
    "rmsnorm_linear_swiglu": "gluon_rmsnorm_gemm_swiglu.py",
}


def _x_g_plan(tag: str, task: str, shape: str, configs: list[dict], rival: tuple) -> Plan:
    """A sweep of the task's Gluon x g kernel at one shape against one Triton rival."""
    return Plan(
        task, X_G_KERNELS[task], [shape], configs, tag=tag, peers=FUSED_PEERS, rivals=[rival]
    )


# The Gluon RMSNorm + qkv + rope (W alone through the ring; each program's x g written once
# for its K slice) at the Llama b16 block's attention input.
GLUON_QKV_PLANS = [
    _x_g_plan(
        "qkv16gluon",
        "rmsnorm_linear_rope",
        "m16-qk40-v8-d128-k4096",
        _gluon_configs(
            [(split, bk, st) for split in (2, 4, 8) for bk, st in ((64, 4), (64, 6), (128, 3))]
        ),
        QKV16_IN_FORCE,
    )
]
# The Gluon RMSNorm + gate/up + SwiGLU in the qkv kernel's shape at both b16 blocks' MLPs. At
# DeepSeek's the tables run torch.compile's kernels (the Triton kernel lost to them per op), so
# the rival there is the Triton kernel's best, a yardstick only (a sweep times no peer). Every
# configuration fits an SM's shared memory at its K (tests/kernels/test_bench_plans.py).
GLUON_SWIGLU_PLANS = [
    _x_g_plan(
        "gateup16gluon",
        "rmsnorm_linear_swiglu",
        "m16-f14336-k4096",
        _gluon_configs(
            [(1, 64, 3), (1, 64, 4), (2, 64, 4), (2, 64, 6), (2, 128, 3), (4, 64, 4), (4, 128, 3)]
        ),
        GATEUP16_IN_FORCE,
    ),
    _x_g_plan(
        "gateup16mlagluon",
        "rmsnorm_linear_swiglu",
        "m16-f18432-k7168",
        _gluon_configs([(2, 64, 4), (2, 128, 2), (4, 64, 4), (4, 64, 6), (4, 128, 3), (8, 64, 4)]),
        GATEUP16MLA_BENCHED,
    ),
]
# The two Gluon kernels at one row, the Llama b1 layer's o projection and qkv (session 26: at b1
# the o GEMV ends 4.6 us a layer after its bytes at copy, streaming wave by wave as much as its
# registers hold): W through a TMA ring from a loader warp, every program resident at once, split
# K keeping the SMs busy (64 tiles of 64 rows at n 4096). Against the Triton GEMVs of the tables
# in force.
GLUON_ONE_ROW_PLANS = [
    Plan(
        "linear_residual",
        "gluon_gemm_residual.py",
        ["m1-n4096-k4096"],
        [
            {"split_k": split, "block_k": block_k, "num_stages": stages, "late_dependents": late}
            for split in (2, 4, 8)
            for block_k, stages in ((128, 5), (64, 10))
            for late in (False, True)
        ],
        tag="o1gluon",
        peers=FUSED_PEERS,
        rivals=[O1_IN_FORCE],
    ),
    _x_g_plan(
        "qkv1gluon",
        "rmsnorm_linear_rope",
        "m1-qk40-v8-d128-k4096",
        _gluon_configs(
            [(split, bk, st) for split in (4, 8) for bk, st in ((64, 4), (64, 6), (128, 3))]
        ),
        QKV1_IN_FORCE,
    ),
]
# Session 37's sweeps of the x g kernels chose the fewest splits, yet even their best lost: a qkv
# program takes two 64-row tiles, so a split is 48 programs, and at 1, 2 or 4 splits the
# busiest SM carries 1/96 of the work (1/132 if spread evenly). The configurations tagged `fit`
# are small enough in shared memory for three programs an SM at eight splits; they were slower
# still (call 2), and its profile said why: uncapped, a build takes 255 registers a thread, so
# one program an SM. The `regs` plans cap the registers (`programs_per_sm`) to let two or three
# programs share an SM where their shared memory also fits (tests/kernels/test_bench_plans.py).
# Session 38 ran them: no capped configuration beat the kernel in force (each plan's best 5-29 %
# slower), here or in the residual plans below (docs/benchmarks/2026-12-01-h200-session38.md).
GLUON_FIT_PLANS = [
    _x_g_plan(
        "qkv16gluonfit",
        "rmsnorm_linear_rope",
        "m16-qk40-v8-d128-k4096",
        _gluon_configs([(8, 64, 2), (8, 64, 3)]),
        QKV16_IN_FORCE,
    ),
    _x_g_plan(
        "qkv1gluonfit",
        "rmsnorm_linear_rope",
        "m1-qk40-v8-d128-k4096",
        _gluon_configs([(8, 64, 2), (8, 64, 3)]),
        QKV1_IN_FORCE,
    ),
    _x_g_plan(
        "gateup16gluonfit",
        "rmsnorm_linear_swiglu",
        "m16-f14336-k4096",
        _gluon_configs([(4, 64, 2), (8, 64, 2), (8, 64, 3)]),
        GATEUP16_IN_FORCE,
    ),
]
GLUON_REGISTER_PLANS = [
    _x_g_plan(
        "qkv16gluonregs",
        "rmsnorm_linear_rope",
        "m16-qk40-v8-d128-k4096",
        _gluon_configs([(4, 64, 4, 2), (8, 64, 2, 3), (8, 64, 3, 3)]),
        QKV16_IN_FORCE,
    ),
    _x_g_plan(
        "qkv1gluonregs",
        "rmsnorm_linear_rope",
        "m1-qk40-v8-d128-k4096",
        _gluon_configs([(4, 64, 4, 2), (8, 64, 2, 3), (8, 64, 3, 3)]),
        QKV1_IN_FORCE,
    ),
    _x_g_plan(
        "gateup16gluonregs",
        "rmsnorm_linear_swiglu",
        "m16-f14336-k4096",
        _gluon_configs([(2, 64, 2, 2), (8, 64, 2, 3), (4, 64, 3, 2)]),
        GATEUP16_IN_FORCE,
    ),
]
# The Gluon GEMM + residual builds the same way (255 registers a thread uncapped), so more than
# one wave of tiles x slices ran as a second wave when its sweeps tried more splits. Capped, two
# or three programs an SM: the configuration in force (one program an SM) against more slices.
RESIDUAL_REGISTER_CONFIGS = [
    (4, 128, 5, 2),
    (4, 64, 10, 2),
    (8, 64, 5, 3),
    (8, 128, 3, 3),
]
GLUON_RESIDUAL_REGISTER_PLANS = [
    Plan(
        "linear_residual",
        "gluon_gemm_residual.py",
        [shape],
        _gluon_configs(in_force + RESIDUAL_REGISTER_CONFIGS, late_dependents=late),
        tag=tag,
        peers=FUSED_PEERS,
        rivals=rivals,
    )
    for tag, shape, late, in_force, rivals in [
        ("o16gluonregs", "m16-n4096-k4096", True, [(1, 128, 5, 1)], []),
        ("down16gluonregs", "m16-n4096-k14336", True, [(2, 128, 5, 1)], []),
        (
            "o1gluonregs",
            "m1-n4096-k4096",
            False,
            [],
            [O1_IN_FORCE],
        ),
    ]
]


# Session 39: the o projection at one row with its W rows copied into shared memory before the
# wait (gluon_gemv_residual.py): 32 rows a program (128 programs, one wave), in buffers of 4 or 8
# rows, the ring as deep as shared memory allows or half of it, at 4 and 8 warps; against the
# Triton GEMV in force, which holds what its registers allow. Its first sweep (call 1) also had
# buffers of 1 and 2 rows, 64 rows a program and `late_dependents` off: slower per op. No
# configuration beat the Triton GEMV, per op (17.1 us at best against 16.8, H100) nor in the
# Llama b1 block (variants in session39/: 0.957-0.986x).
GEMV_SHARED_PLANS = [
    Plan(
        "linear_residual",
        "gluon_gemv_residual.py",
        ["m1-n4096-k4096"],
        [
            dict(
                rows=32, block_rows=group, num_stages=stages, late_dependents=True, num_warps=warps
            )
            for group, stages in ((4, 7), (8, 3), (4, 4))
            for warps in (4, 8)
        ],
        tag="o1shared",
        peers=FUSED_PEERS,
        rivals=[O1_IN_FORCE],
    )
]
# The 16-row cluster qkv kernel alone against the Triton kernel in force. Session 51 profiled its
# block table (split 4, 64 rows, 4 warps, ring of 3: three blocks an SM) on an H200: only 92 of its
# 96 clusters of four fit at once, and alone it took 25.9 us against the Triton kernel's 19.5.
# Here, beside that one: four blocks an SM (2 warps, ring of 4) and clusters of two (split 2,
# 32 rows a block: 192 clusters, 384 blocks; at 4 warps and a ring of 4 still three blocks an
# SM), which may fit in one wave (the profile's Max Active Clusters says). Session 52 (H100): the
# two profiled fit at once, and every configuration loses alone, the best (split 2, ring 3)
# 29.1 us against 24.8: dropped.
CLUSTER_QKV_PLANS = [
    Plan(
        "rmsnorm_linear_rope",
        "cuda_rmsnorm_gemm_rope_cluster.py",
        ["m16-qk40-v8-d128-k4096"],
        [
            {"split_k": split, "n_tiles": tiles, "k_warps": warps, "stages": stages}
            for split, tiles, warps, stages in (
                (4, 4, 4, 3),
                (4, 4, 2, 4),
                (2, 2, 4, 3),
                (2, 2, 4, 4),
                (2, 2, 2, 4),
            )
        ],
        tag="qkv16cluster",
        peers=FUSED_PEERS,
        rivals=[QKV16_IN_FORCE],
    )
]

# The Triton RMSNorm + gate/up + SwiGLU at 16 rows with every program resident at once. At
# DeepSeek-V3's MLP (f 18432, k 7168) the bench's configuration (64 columns, K steps of 128)
# builds to 221-228 registers a thread, so two programs fit an SM: 264 at a time for 288 tiles
# (576 programs at split 2), and the last ones stream alone at the end. K steps of 64 build to
# 72-188 registers and no spills (Triton 3.6 for sm_90, session 52), so 288 tiles of 64 columns
# (four an SM by registers at 4 warps, three at 8), 576 of 32 or 144 of 128 all fit at once. At
# the Llama shape (224 tiles of 64) the configuration in force already fits; the same
# configurations there, for the step's depth alone. Session 52 (H100): alone all within 1.5 % of
# the rival at DeepSeek's shape, 10-14 % slower at Llama's; in the blocks no gain (DeepSeek
# 0.987-0.999x, Llama 0.977-0.980x).
RESIDENT_SWIGLU_CONFIGS = [
    {"block_n": n, "block_k": 64, "split_k": 1, "num_warps": w, "num_stages": s, "x_ahead": True}
    for n, w, s in (
        (64, 4, 3),
        (64, 4, 4),
        (64, 8, 4),
        (32, 4, 3),
        (32, 4, 4),
        (128, 4, 3),
        (128, 8, 4),
    )
]
RESIDENT_SWIGLU_PLANS = [
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemm_swiglu.py",
        [shape],
        RESIDENT_SWIGLU_CONFIGS,
        tag=tag,
        peers=FUSED_PEERS,
        rivals=[rival],
    )
    for tag, shape, rival in (
        ("gateup16mlaresident", "m16-f18432-k7168", GATEUP16MLA_BENCHED),
        ("gateup16resident", "m16-f14336-k4096", GATEUP16_IN_FORCE),
    )
]


PLANS = [
    Plan(
        "rmsnorm",
        "triton_rmsnorm.py",
        ["long-32768x7168", "long-131072x4096", "prefill-4096x4096", "decode-16x7168"],
        _grid(
            {"num_warps": [4, 8, 16], "rows_per_program": [1, 2]},
            {"num_warps": 8, "x_eviction": "evict_first", "chunk": 4096},
        ),
    ),
    Plan(
        "add_rmsnorm",
        "triton_add_rmsnorm.py",
        ["long-32768x7168", "long-131072x7168", "long-131072x4096", "prefill-4096x7168"],
        _grid(
            {"num_warps": [4, 8, 16], "rows_per_program": [1, 2]},
            {"num_warps": 8, "load_eviction": "evict_first"},
            {"num_warps": 8, "store_cache": ".cs"},
            {"num_warps": 16, "load_eviction": "evict_first", "store_cache": ".cs"},
        ),
    ),
    Plan(
        "softmax",
        "triton_softmax.py",
        VOCAB_SHAPES,
        _grid(
            {"block": [4096, 8192, 16384], "num_warps": [8, 16, 32]},
            {"block": 8192, "num_warps": 16, "pass1_eviction": "", "pass2_eviction": ""},
            {"block": 8192, "num_warps": 16, "store_cache": ".cs"},
            {"block": 8192, "num_warps": 16, "num_stages": 2},
        ),
    ),
    Plan(
        "softmax",
        "cupy_softmax.py",
        VOCAB_SHAPES,
        _grid({"threads": [512, 1024], "cache_kb": [0, 96, 200], "unroll": [2, 4]}),
    ),
    Plan(
        "softmax",
        "cupy_softmax.py",
        VOCAB_SHAPES,
        _grid({"cluster": [2, 4, 8], "threads": [256, 512, 1024], "unroll": [2, 4]}),
        tag="cluster",
    ),
    Plan(
        "softmax",
        "cupy_softmax_resident.py",
        VOCAB_SHAPES,
        RESIDENT_GRID,
    ),
    Plan(
        "softmax",
        "cupy_softmax_resident.py",
        VOCAB_DECODE_SHAPES,
        RESIDENT_DECODE_GRID,
        tag="decode",
    ),
    Plan(
        "softmax",
        "cupy_softmax_resident.py",
        ["prefill-8192x151936", "prefill-2048x151936"],
        RESIDENT_GRID,
        tag="152k",
    ),
    Plan(
        "softmax",
        "cupy_softmax_resident.py",
        VOCAB_SHAPES,
        [{"threads": 256, "slice_kb": 32}, *PIPELINED_GRID],
        tag="pipelined",
    ),
    Plan(
        "softmax",
        "cupy_softmax_resident.py",
        ["prefill-8192x151936", "prefill-2048x151936"],
        [{"threads": 128, "slice_kb": 64}, *PIPELINED_152K_GRID],
        tag="pipelined152k",
    ),
    Plan(
        "softmax",
        "cupy_softmax_resident.py",
        ["decode-64x32000"],
        RESIDENT_DECODE_GRID,
        tag="32k",
    ),
    Plan(
        "cross_entropy",
        "triton_cross_entropy.py",
        VOCAB_SHAPES,
        _grid(
            {"block": [4096, 8192, 16384], "num_warps": [8, 16, 32]},
            {"block": 8192, "num_warps": 16, "eviction": ""},
        ),
    ),
    Plan(
        "skinny_gemm",
        "cupy_gemv.py",
        [f"m{m}-{nk}" for nk in SKINNY_NK for m in (1, 16)],
        _grid({"rows": [16], "warps_per_block": [4, 8, 16], "unroll": [2, 4, 8]}),
        peers=GEMV_PEERS,
    ),
    Plan(
        "skinny_gemm",
        "cupy_gemv_splitk.py",
        [f"m1-{nk}" for nk in SKINNY_NK] + ["m4-n7168-k7168", "m4-n4096-k14336"],
        SPLITK_GRID,
        peers=GEMV_PEERS,
    ),
    # The plan above swept at 4096 x 4096 only; the long rows of the down projections and the
    # wide qkv and gate+up weights get their own sweeps.
    Plan(
        "skinny_gemm",
        "cupy_gemv_splitk.py",
        ["m1-n4096-k14336", "m1-n7168-k18432"],
        SPLITK_GRID,
        tag="longk",
        peers=GEMV_PEERS,
    ),
    Plan(
        "skinny_gemm",
        "cupy_gemv_splitk.py",
        ["m1-n6144-k4096", "m1-n28672-k4096"],
        SPLITK_GRID,
        tag="wide",
        peers=GEMV_PEERS,
    ),
    # The fused decode GEMVs (a norm folded in before, a residual add after) at the projections
    # the Llama-3-8B and DeepSeek-V3 blocks call them at. The CUDA ones swept at one token and 16
    # rows (where the peers, cuBLAS and a separate norm or add, are expected to keep the shape);
    # the Triton ones (row-resident, with programmatic dependent launch) at one token.
    *(
        plan
        for task, tag, nk in [
            ("rmsnorm_linear", "qkv", "n6144-k4096"),
            ("rmsnorm_linear", "gateup", "n28672-k4096"),
            ("linear_residual", "o", "n4096-k4096"),
            ("linear_residual", "down", "n4096-k14336"),
            ("rmsnorm_linear", "mla_qkv_a", "n2112-k7168"),
            ("rmsnorm_linear", "mla_q_b", "n24576-k1536"),
            ("linear_residual", "mla_o", "n7168-k16384"),
            ("linear_residual", "mla_down", "n7168-k18432"),
        ]
        for plan in (
            Plan(
                task,
                GEMVS[task][0],
                [f"m1-{nk}", f"m16-{nk}"],
                SPLITK_GRID,
                tag=tag,
                peers=FUSED_PEERS,
            ),
            Plan(task, GEMVS[task][1], [f"m1-{nk}"], TRITON_GEMV_GRID, tag=tag, peers=FUSED_PEERS),
        )
    ),
    # The persistent, pipelined GEMVs (a run of W's rows a program, tiles kept in flight in
    # shared memory) at DeepSeek-V3's one-token projections, where the one-shot Triton GEMVs
    # stream W at 91-93 % (the residual ones) and 60-83 % (the norm ones) of copy in the block,
    # and at Llama-3-8B's o and down projections.
    *(
        Plan(task, STREAM_GEMVS[task], [f"m1-{nk}"], grid, tag=tag, peers=FUSED_PEERS)
        for task, grid, tag, nk in [
            ("linear_residual", STREAM_LONG_K, "mla_o", "n7168-k16384"),
            ("linear_residual", STREAM_LONG_K, "mla_down", "n7168-k18432"),
            ("rmsnorm_linear", STREAM_SHORT_K, "mla_q_b", "n24576-k1536"),
            ("rmsnorm_linear", STREAM_SHORT_K, "mla_qkv_a", "n2112-k7168"),
            ("linear_residual", STREAM_SHORT_K, "o", "n4096-k4096"),
            ("linear_residual", STREAM_LONG_K, "down", "n4096-k14336"),
        ]
    ),
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemv_swiglu.py",
        ["m1-f18432-k7168"],
        TRITON_GEMV_GRID,
        tag="mla_gateup",
        peers=FUSED_PEERS,
    ),
    # The fused GEMMs on tensor cores at 16 rows (batch 16's o, down and gate/up projections).
    *(
        Plan(task, candidate, shapes, TRITON_GEMM_GRID, tag=tag, peers=FUSED_PEERS)
        for task, candidate, tag, shapes in [
            (
                "linear_residual",
                "triton_gemm_residual.py",
                "o16",
                ["m16-n4096-k4096", "m4-n4096-k4096"],
            ),
            (
                "linear_residual",
                "triton_gemm_residual.py",
                "down16",
                ["m16-n4096-k14336", "m4-n4096-k14336"],
            ),
        ]
    ),
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemm_swiglu.py",
        ["m16-f14336-k4096", "m4-f14336-k4096"],
        TRITON_GEMM_PAIR_GRID,
        tag="gateup16",
        peers=FUSED_PEERS,
    ),
    Plan(
        "rmsnorm_linear_rope",
        "triton_rmsnorm_gemm_rope.py",
        ["m16-qk40-v8-d128-k4096", "m4-qk40-v8-d128-k4096"],
        _grid({"block_n": [32, 64], "block_k": [128, 256], "split_k": [1, 2, 4, 8]}),
        tag="qkv16",
        peers=FUSED_PEERS,
    ),
    # The next K step's x and g loaded a step ahead (session 14: profiled at 16 rows, 45 % of
    # the rope kernel's stall samples waited on global loads, most on x's and g's), against the
    # best without it.
    Plan(
        "rmsnorm_linear_rope",
        "triton_rmsnorm_gemm_rope.py",
        ["m16-qk40-v8-d128-k4096"],
        [
            {"block_n": 64, "block_k": 128, "split_k": 4},
            *_grid(
                {"block_n": [32, 64], "block_k": [128], "split_k": [2, 4, 8], "x_ahead": [True]}
            ),
        ],
        tag="qkv16ahead",
        peers=FUSED_PEERS,
    ),
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemm_swiglu.py",
        ["m16-f14336-k4096"],
        [
            {"block_n": 64, "block_k": 128, "split_k": 1},
            *_grid({"block_n": [64], "block_k": [128], "split_k": [1, 2, 4], "x_ahead": [True]}),
        ],
        tag="gateup16ahead",
        peers=FUSED_PEERS,
    ),
    # The next kernel launched only as the products end (late_dependents): in the Llama b16
    # block the fused SwiGLU lost (0.964x) where per op it won (session 14, call 4).
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemm_swiglu.py",
        ["m16-f14336-k4096"],
        _grid(
            {"block_n": [64], "block_k": [128], "split_k": [1], "x_ahead": [True]},
            {"block_n": 64, "block_k": 128, "split_k": 1, "x_ahead": True, "late_dependents": True},
        ),
        tag="gateup16late",
        peers=FUSED_PEERS,
    ),
    # The o projection's configurations taken into the Llama b16 block's tables, with
    # late_dependents (which changes only where the next kernel may launch), per op.
    Plan(
        "linear_residual",
        "triton_gemm_residual.py",
        ["m16-n4096-k4096"],
        _grid(
            {"block_n": [64], "block_k": [128, 256], "split_k": [4], "late_dependents": [True]},
            {"block_n": 64, "block_k": 256, "split_k": 2, "late_dependents": True},
        ),
        tag="o16late",
        peers=FUSED_PEERS,
    ),
    # Warps and pipeline depth at the b16 blocks' qkv, o and down shapes, which earlier sweeps
    # ran at 4 warps and 3 stages only (at q_a/kv_a, session 22 found 2 warps best).
    Plan(
        "rmsnorm_linear_rope",
        "triton_rmsnorm_gemm_rope.py",
        ["m16-qk40-v8-d128-k4096"],
        _grid(
            {
                "block_n": [16, 32],
                "block_k": [128],
                "split_k": [4, 8],
                "num_warps": [2, 4],
                "num_stages": [3, 4],
                "x_ahead": [True],
            }
        ),
        tag="qkv16warps",
        peers=FUSED_PEERS,
    ),
    *(
        Plan(
            "linear_residual",
            "triton_gemm_residual.py",
            [shape],
            _grid(
                {
                    "block_n": [32, 64],
                    "block_k": [128],
                    "split_k": splits,
                    "num_warps": [2, 4],
                    "num_stages": [3, 4],
                    "late_dependents": [late],
                }
            ),
            tag=tag,
            peers=FUSED_PEERS,
        )
        for tag, shape, splits, late in [
            ("o16warps", "m16-n4096-k4096", [4, 8], True),
            ("down16warps", "m16-n4096-k14336", [4, 8], False),
            # DeepSeek-V3's o and down at 16 rows (the MLA block's), 86 and 91 % of copy there.
            ("o16mlawarps", "m16-n7168-k16384", [2, 4], False),
            ("down16mlawarps", "m16-n7168-k18432", [2, 4], False),
        ]
    ),
    # DeepSeek-V3's MLP (the MLA block's) at 16 rows: gate/up with x_ahead, and the down and o
    # projections on tensor cores.
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemm_swiglu.py",
        ["m16-f18432-k7168"],
        _grid({"block_n": [64], "block_k": [128], "split_k": [1, 2], "x_ahead": [False, True]}),
        tag="gateup16mla",
        peers=FUSED_PEERS,
    ),
    Plan(
        "linear_residual",
        "triton_gemm_residual.py",
        ["m16-n7168-k18432", "m16-n7168-k16384"],
        _grid({"block_n": [64], "block_k": [128, 256], "split_k": [2, 4, 8]}),
        tag="down16mla",
        peers=FUSED_PEERS,
    ),
    *GLUON_RESIDUAL_PLANS,
    *GLUON_QKV_PLANS,
    *GLUON_SWIGLU_PLANS,
    *GLUON_ONE_ROW_PLANS,
    *GLUON_FIT_PLANS,
    *GLUON_REGISTER_PLANS,
    *GLUON_RESIDUAL_REGISTER_PLANS,
    *GEMV_SHARED_PLANS,
    *CLUSTER_QKV_PLANS,
    *RESIDENT_SWIGLU_PLANS,
    # The attention's input norm folded into DeepSeek-V3's q_a/kv_a projection (N = 2112: 33 tiles
    # of 64, so K is split to fill the SMs) and the q norm into q_b (K = 1536) at 16 rows, on
    # tensor cores: at batch 16 these shapes had no candidate of ours, and the block ran
    # torch.compile's norm kernel, then cuBLAS (and for q_a its split-K reduce kernel).
    Plan(
        "rmsnorm_linear",
        "triton_rmsnorm_gemm.py",
        ["m16-n2112-k7168"],
        # Session 22's first sweep put the best (block_n 32, split_k 8) at the grid's edge: this
        # one goes to narrower tiles, more slices and deeper pipelines.
        _grid(
            {
                "block_n": [16, 32, 64],
                "block_k": [128],
                "split_k": [4, 8, 16],
                "num_warps": [2, 4],
                "num_stages": [3, 4],
                "x_ahead": [True],
            },
            {"block_n": 32, "block_k": 256, "split_k": 8, "x_ahead": True},
        ),
        tag="mla_qkv_a16",
        peers=FUSED_PEERS,
    ),
    Plan(
        "rmsnorm_linear",
        "triton_rmsnorm_gemm.py",
        ["m16-n24576-k1536"],
        # 24576 / 128 is 192 programs, 1.45 waves of 132 SMs: narrower tiles and two slices even
        # the waves out.
        _grid(
            {
                "block_n": [64, 128],
                "block_k": [64, 128],
                "split_k": [1, 2],
                "num_warps": [4, 8],
                "num_stages": [3, 4],
                "x_ahead": [True],
            }
        ),
        tag="mla_q_b16",
        peers=FUSED_PEERS,
    ),
    # The MLP's norm, gate/up projection and SwiGLU in one kernel, and the attention's norm,
    # qkv projection and rope (Llama-3-8B's), swept at one token; at 16 rows the peers are
    # expected to keep the shapes.
    Plan(
        "rmsnorm_linear_swiglu",
        "triton_rmsnorm_gemv_swiglu.py",
        ["m1-f14336-k4096", "m16-f14336-k4096"],
        TRITON_GEMV_GRID,
        tag="gateup",
        peers=FUSED_PEERS,
    ),
    Plan(
        "rmsnorm_linear_rope",
        "triton_rmsnorm_gemv_rope.py",
        ["m1-qk40-v8-d128-k4096", "m16-qk40-v8-d128-k4096"],
        TRITON_GEMV_GRID,
        tag="qkv",
        peers=FUSED_PEERS,
    ),
    # The tensor-core GEMV at 16 rows (and 4, where the split-K GEMV loses to cuBLAS by 2x),
    # swept at each weight: the best tile and split differ with N and K.
    *(
        Plan("skinny_gemm", "cupy_gemv_mma.py", shapes, MMA_GRID, tag=tag, peers=GEMV_PEERS)
        for tag, shapes in [
            ("mma", ["m16-n4096-k4096", "m4-n7168-k7168", "m4-n4096-k14336"]),
            ("mma6144", ["m16-n6144-k4096"]),
            ("mmawide", ["m16-n28672-k4096"]),
            ("mmalongk", ["m16-n4096-k14336"]),
            ("mma18432", ["m16-n7168-k18432"]),
        ]
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        VOCAB_SHAPES,
        RESIDENT_GRID,
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        VOCAB_DECODE_SHAPES,
        RESIDENT_DECODE_GRID,
        tag="decode",
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        ["decode-64x32000", "decode-256x32000"],
        RESIDENT_DECODE_GRID,
        tag="32k",
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        ["decode-256x32000"],
        RESIDENT_DECODE_GRID,
        tag="256x32k",
    ),
    # The resident cross-entropy's exchange at the two decode shapes, one plan a (tag, shape):
    # - exit*: only warp 0 at the exchange's second cluster barrier, and only block 0 waiting at
    #   it (session 14: at decode 64 x 128256, 54 % of the stall samples were barrier and
    #   memory-barrier stalls, a quarter of all at the cluster barrier's wait);
    # - pairs*: each warp's pair straight to block 0 of the cluster (warp_pairs: no block
    #   barrier, one combine fewer before the loss), against the tables' configuration then;
    # - pairswide*: warp_pairs at the block sizes the pairs plans left out;
    # - async*: the warps' pairs sent as asynchronous stores counted in on a transaction barrier
    #   in block 0 (async_pairs: no release fence, no second cluster barrier; session 14's
    #   profile at 64 x 32000 had 13 % of its stall samples at memory barriers), and the warp
    #   max as one redux (redux_max), against warp_pairs alone;
    # (session 30 timed three more switches, target_first, redux_sum and prefetch_256b, as the
    # first* and tune* plans, and they won nothing, so the kernel and these plans lost them.)
    *(
        Plan("cross_entropy", "cupy_cross_entropy_resident.py", [shape], configs, tag=tag)
        for tag, shape, configs in [
            (
                "exit32k",
                "decode-64x32000",
                _grid({"threads": [256], "slice_kb": [8, 16], "early_exit": [False, True]}),
            ),
            (
                "exit128k",
                "decode-64x128256",
                _grid({"threads": [512], "slice_kb": [8, 16], "early_exit": [False, True]}),
            ),
            (
                "pairs32k",
                "decode-64x32000",
                _grid(
                    {"threads": [128, 256], "slice_kb": [8, 16], "warp_pairs": [True]},
                    {"threads": 256, "slice_kb": 8},
                ),
            ),
            (
                "pairs128k",
                "decode-64x128256",
                _grid(
                    {"threads": [256, 512], "slice_kb": [8, 16], "warp_pairs": [True]},
                    {"threads": 512, "slice_kb": 16, "early_exit": True},
                ),
            ),
            (
                "pairswide32k",
                "decode-64x32000",
                _grid({"threads": [128, 256, 512], "slice_kb": [8], "warp_pairs": [True]}),
            ),
            (
                "pairswide128k",
                "decode-64x128256",
                _grid({"threads": [128, 512, 1024], "slice_kb": [8], "warp_pairs": [True]}),
            ),
            *(
                (
                    f"async{size}",
                    shape,
                    _grid(
                        {
                            **launch,
                            "warp_pairs": [True],
                            "async_pairs": [False, True],
                            "redux_max": [False, True],
                        }
                    ),
                )
                for size, shape, launch in [
                    ("32k", "decode-64x32000", {"threads": [128, 256], "slice_kb": [8]}),
                    ("128k", "decode-64x128256", {"threads": [512], "slice_kb": [8, 16]}),
                ]
            ),
        ]
    ),
    # The down projections at 16 rows letting the next layer's first kernel in only as their
    # products end (late_dependents, 1.002-1.003x in the b16 blocks in session 25), per op:
    # Llama's, and DeepSeek-V3's (the MLA block's), at the blocks' configurations.
    *(
        Plan(
            "linear_residual",
            "triton_gemm_residual.py",
            [shape],
            _grid({**best, "late_dependents": [False, True]}),
            tag=tag,
            peers=FUSED_PEERS,
        )
        for tag, shape, best in [
            ("down16late", "m16-n4096-k14336", {"block_n": [64], "block_k": [128], "split_k": [4]}),
            (
                "down16mlalate",
                "m16-n7168-k18432",
                {"block_n": [32], "block_k": [128], "split_k": [4], "num_warps": [2]},
            ),
        ]
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        VOCAB_DECODE_SHAPES,
        GLOBAL_DECODE_GRID,
        tag="global",
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        ["decode-64x32000", "decode-256x32000"],
        GLOBAL_DECODE_GRID,
        tag="global32k",
    ),
    Plan(
        "cross_entropy",
        "cupy_cross_entropy_resident.py",
        VOCAB_SHAPES,
        GLOBAL_PREFILL_GRID,
        tag="globalprefill",
    ),
    Plan(
        "swiglu",
        "triton_swiglu.py",
        ["long-32768x18432", "long-32768x14336", "prefill-4096x14336", "decode-64x18432"],
        _grid(
            {"block": [1024, 2048, 4096], "num_warps": [4, 8]},
            {"block": 2048, "num_warps": 4, "rows_per_program": 2},
            {"block": 2048, "num_warps": 4, "load_eviction": ""},
            {"block": 2048, "num_warps": 4, "store_cache": ".cs"},
            {"block": 2048, "num_warps": 4, "load_eviction": "", "order": "memory"},
            {"block": 1024, "num_warps": 4, "load_eviction": "", "order": "memory"},
            {"block": 4096, "num_warps": 8, "load_eviction": "", "order": "memory"},
        ),
    ),
    Plan(
        "rope",
        "triton_rope.py",
        ["long-32768x32x128", "long-131072x32x128", "long-131072x8x128", "prefill-4096x32x128"],
        _grid(
            {"head_block": [8, 16, 32], "num_warps": [2, 4, 8]},
            {"head_block": 32, "num_warps": 4, "tokens_per_program": 2},
            {"head_block": 8, "num_warps": 2, "tokens_per_program": 4},
        ),
    ),
    # MLA's absorbed projections (head_gemv): the key projection into the query (n 512, k 128)
    # and the value projection after attention (n 128, k 512), a plan per batch so that each
    # bucket gets its own best: tensor cores over 16 padded rows, or (batch 1) a broadcast
    # multiply-reduce one row a program.
    *(
        Plan(
            "head_gemv",
            "triton_head_gemv.py",
            [f"b{batch}-h128-{nk}"],
            HEAD_GEMV_DOT_GRID + (HEAD_GEMV_ROW_GRID if batch == 1 else []),
            tag=f"{tag}{batch}",
            peers=FUSED_PEERS,
        )
        for tag, nk in [("in", "n512-k128"), ("out", "n128-k512")]
        for batch in (1, 16, 64)
    ),
    # MLA's rope and latent norm in one kernel, a plan per token bucket, swept at DeepSeek-V3's
    # 128 heads and benched at V2-Lite's 16 too.
    *(
        Plan(
            "mla_rope_norm",
            "triton_mla_rope_norm.py",
            [f"{cls}-{tokens}x{heads}-d128-r64-c512" for heads in (128, 16)],
            _grid({"head_block": [8, 16, 32, 64, 128], "num_warps": [1, 2, 4]}),
            tag=f"ropenorm{tokens}",
            peers=FUSED_PEERS,
        )
        for cls, tokens in [("decode", 1), ("decode", 16), ("decode", 64), ("prefill", 4096)]
    ),
    # MLA's attention with its value projection: the merge-and-project kernel's steps and warps
    # swept at batch 1 (a sequence a program) and 16 (tensor cores over 16 sequences).
    Plan(
        "mla_decode_value",
        "gluon_mla_decode_value.py",
        ["b1-kv32768", "b1-kv4096", "b1-kv131072"],
        _grid(
            {"block_m": [1], "block_k": [32, 64, 128], "merge_warps": [4, 8]},
            *(
                {"block_k": k, "merge_warps": w, "merge_stages": 2}
                for k in (64, 128)
                for w in (4, 8)
            ),
            {"block_k": 32, "merge_stages": 4},
            {"block_k": 64, "merge_stages": 4, "merge_warps": 8},
            *(
                {"block_k": k, "column_slices": c}
                for c in (2, 4, 8)
                for k in (32, 64, 128)
                if k * c <= 512
            ),
            {"block_k": 64, "column_slices": 4, "merge_stages": 2},
        ),
        tag="mlavalue1",
        peers=FUSED_PEERS,
    ),
    Plan(
        "mla_decode_value",
        "gluon_mla_decode_value.py",
        ["b16-kv4096", "b16-kv8192", "b64-kv4096"],
        _grid(
            {"block_m": [1, 16], "block_k": [64, 128], "merge_warps": [4, 8]},
            {"block_m": 16, "block_k": 64, "merge_warps": 4, "merge_stages": 2},
            *_grid({"block_m": [16], "block_k": [32, 64, 128], "column_slices": [2, 4]}),
            *_grid({"block_m": [1], "block_k": [64], "column_slices": [2, 4]}),
        ),
        tag="mlavalue16",
        peers=FUSED_PEERS,
    ),
    # The CUDA C++ split kernel (cuda_mla_decode_value.py: one warpgroup's softmax beside the
    # other's products) against the Gluon one in each build (32-row tiles in a ring of 4, 64-row
    # tiles in a ring of 2), each also with the other's value product between the two groups of
    # a warpgroup's scores (values_between), with the merge the tables run at 16 sequences
    # (session 47's), and one with 64-column steps; then at one sequence with the tables' merge
    # there (four column slices), in each build and the 64-row one with values_between.
    Plan(
        "mla_decode_value",
        "cuda_mla_decode_value.py",
        ["b16-kv4096", "b16-kv8192", "b64-kv4096"],
        [
            MLA_MERGE16,
            CUDA_MLA_ROWS64 | MLA_MERGE16,
            CUDA_MLA_BETWEEN | MLA_MERGE16,
            CUDA_MLA_ROWS64 | CUDA_MLA_BETWEEN | MLA_MERGE16,
            {"block_m": 16, "block_k": 64, "merge_warps": 4},
        ],
        tag="cudamla16",
        peers=FUSED_PEERS,
        rivals=[("gluon_mla_decode_value.py", MLA_MERGE16)],
    ),
    Plan(
        "mla_decode_value",
        "cuda_mla_decode_value.py",
        ["b1-kv32768", "b1-kv4096", "b1-kv131072"],
        [MLA_MERGE1, CUDA_MLA_ROWS64 | MLA_MERGE1, CUDA_MLA_ROWS64 | CUDA_MLA_BETWEEN | MLA_MERGE1],
        tag="cudamla1",
        peers=FUSED_PEERS,
        rivals=[("gluon_mla_decode_value.py", MLA_MERGE1)],
    ),
    # Llama's attention with the output projection and its add, no merge kernel between them:
    # the projection's row blocks, heads a program, tiles ahead and warps (configurations that
    # spill no register), at one sequence. Session 40 (H100): 36.8-94.2 us per op; in the Llama
    # b1 block every variant lost to the tables then in force (0.631-0.962x).
    Plan(
        "gqa_decode_residual",
        "triton_gqa_decode_residual.py",
        ["b1-kv4096", "b1-kv32768", "b16-kv4096"],
        [
            dict(block_r=r, heads_per_program=h, ahead=a, num_warps=w, split_tokens=t)
            for r, h, a, w in ((128, 8, 2, 8), (64, 8, 1, 4), (64, 4, 2, 4), (128, 1, 1, 8))
            for t in (128, 256)
        ]
        + [dict(block_r=32, heads_per_program=32, ahead=2, num_warps=4, split_tokens=128)],
        tag="gqaresidual",
        peers=["eager", "torch.compile", "sdpa-gqa"],
    ),
]


# The shapes the decoder blocks of loop/blocks.py call these ops at, at the sizes of
# scripts/bench_e2e_block.py (decode at batch 1 and 16, a 4096-token prefill; Llama-3-8B and
# DeepSeek-V3 widths): benched with --e2e-shapes so the dispatch tables cover the blocks.
E2E_SHAPES = {
    "rmsnorm": [
        f"{m}x{h}" for h in (4096, 7168) for m in ("decode-1", "decode-16", "prefill-4096")
    ],
    "swiglu": [
        f"{m}x{f}" for f in (14336, 18432) for m in ("decode-1", "decode-16", "prefill-4096")
    ],
    "rope": [
        f"{m}x{h}x128" for h in (32, 8, 40) for m in ("decode-1", "decode-16", "prefill-4096")
    ],
}
E2E_SHAPES["add_rmsnorm"] = E2E_SHAPES["rmsnorm"]


def sweep(plan: Plan, out_dir: Path) -> dict:
    """Every configuration of `plan` at its first shape, interleaved in one worker; returns the
    fastest accepted configuration's parameters ({} when none was accepted)."""
    from loop.evaluator import QUICK_RULE, CandidateSpec, evaluate
    from loop.tasks import load_task

    task = load_task(plan.task)
    shape_name = plan.shapes[0]
    shape = next(s for s in task.shapes("cuda") if s.name == shape_name)
    runs = [(plan.candidate, params, False) for params in plan.configs]
    runs += [(name, params, True) for name, params in plan.rivals]
    specs = [
        CandidateSpec(task.folder / name, params, f"c{i}")
        for i, (name, params, _) in enumerate(runs)
    ]
    started = time.monotonic()
    ev = evaluate(task, specs, "cuda", time_it=True, shapes=[shape_name], rule=QUICK_RULE)
    nbytes = task.bytes_moved(shape)
    copy_bw = (ev.ceilings or {}).get("copy_bytes_per_s")
    rows = []
    for (name, _, rival), v in zip(runs, ev.verdicts, strict=True):
        result = v.shapes.get(shape_name)
        median = result.median_s if result else None
        rows.append(
            {
                "candidate": name,
                "rival": rival,
                "params": v.params,
                "accepted": v.accepted,
                "reasons": [r.to_dict() for r in v.reasons],
                "median_s": median,
                "TBps": nbytes / median / 1e12 if median else None,
                "fraction_of_copy": nbytes / median / copy_bw if median and copy_bw else None,
            }
        )
    timed = [r for r in rows if r["accepted"] and r["median_s"] and not r["rival"]]
    best = min(timed, key=lambda r: r["median_s"], default=None)
    data = {
        "task": plan.task,
        "candidate": plan.candidate,
        "shape": shape_name,
        "bytes_moved": nbytes,
        "ceilings": ev.ceilings,
        "configs": rows,
        "best": best,
        "seconds": time.monotonic() - started,
    }
    stem = plan.stem("sweep")
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=2))
    if best:
        print(
            f"{stem}: best {best['params']} {best['median_s'] * 1e6:.1f} us "
            f"{best['TBps']:.2f} TB/s ({(best['fraction_of_copy'] or 0) * 100:.1f} % of copy); "
            f"{len(timed)}/{len(rows)} accepted, {data['seconds']:.0f} s",
            flush=True,
        )
    else:
        print(f"{stem}: no configuration accepted: {rows[0]['reasons']}", flush=True)
    for row in rows:
        if row["rival"]:
            us = f"{row['median_s'] * 1e6:.1f} us" if row["median_s"] else "not timed"
            print(f"  rival {row['candidate']} {row['params']}: {us}", flush=True)
    return best["params"] if best else {}


def earlier_best(plan: Plan, folders: list[Path]) -> dict:
    """The best accepted configuration an earlier sweep of `plan` wrote into one of `folders`
    (the last folder that has one), else {} (the candidate's defaults)."""
    params: dict = {}
    for folder in folders:
        path = folder / f"{plan.stem('sweep')}.json"
        if path.exists():
            best = json.loads(path.read_text()).get("best")
            if best:
                params = best["params"]
    return params


def _autotune() -> list[str]:
    exe = shutil.which("autotune")
    return [exe] if exe else [sys.executable, "-c", "from appliance.cli import main; main()"]


def bench(plan: Plan, params: dict, peers: list[str], out_dir: Path) -> None:
    cmd = [*_autotune(), "bench", plan.task, plan.candidate, "--device", "cuda", "--json"]
    if params:
        cmd += ["--params", json.dumps(params)]
    for shape in plan.shapes:
        cmd += ["--shape", shape]
    for peer in peers:
        cmd += ["--peer", peer]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    stem = plan.stem("bench")
    (out_dir / f"{stem}.json").write_text(proc.stdout)
    if proc.stderr.strip():
        (out_dir / f"{stem}.stderr.txt").write_text(proc.stderr)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        print(f"{stem}: exit {proc.returncode}, no JSON; see {stem}.stderr.txt", flush=True)
        return
    print(f"{stem}: {data.get('verdict')} in {time.monotonic() - started:.0f} s", flush=True)
    for row in data.get("table", []):
        sp = row.get("speedup_vs_best_peer") or {}
        cand = row.get("candidate_s")
        peers_us = {k: round(v * 1e6, 1) for k, v in row["peers"].items() if v}
        print(
            f"  {row['shape']}: {cand * 1e6 if cand else float('nan'):.1f} us, peers {peers_us}, "
            f"{sp.get('ratio', float('nan')):.3f}x vs {row.get('best_peer')}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sweep", action="store_true", help="Sweep configurations first.")
    parser.add_argument("--no-bench", action="store_true", help="Stop after the sweep.")
    parser.add_argument("--tasks", default="", help="Comma-separated task names [all].")
    parser.add_argument("--peer", action="append", default=[], help="Peers for bench [all].")
    parser.add_argument(
        "--candidates", default="", help="Comma-separated candidate files (cupy_softmax.py) [all]."
    )
    parser.add_argument(
        "--tags", default="", help="Comma-separated plan tags ('-' for untagged plans) [all]."
    )
    parser.add_argument(
        "--e2e-shapes",
        action="store_true",
        help="Also bench the shapes the end-to-end decoder blocks call (E2E_SHAPES).",
    )
    parser.add_argument(
        "--best-from",
        action="append",
        default=[],
        type=Path,
        help="Folder of an earlier sweep's JSON files: bench their best configurations "
        "without sweeping again (later folders win).",
    )
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {t for t in args.tasks.split(",") if t}
    for plan in PLANS:
        if wanted and plan.task not in wanted:
            continue
        if args.candidates and plan.candidate not in args.candidates.split(","):
            continue
        if args.tags and (plan.tag or "-") not in args.tags.split(","):
            continue
        if args.e2e_shapes:
            extra = [s for s in E2E_SHAPES.get(plan.task, []) if s not in plan.shapes]
            plan = replace(plan, shapes=[*plan.shapes, *extra])
        params = sweep(plan, args.out_dir) if args.sweep else earlier_best(plan, args.best_from)
        if not args.no_bench:
            bench(plan, params, args.peer or plan.peers, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

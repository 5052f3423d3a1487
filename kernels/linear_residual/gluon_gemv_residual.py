"""The GEMV with its residual add (y = x W^T + r) in Gluon for Hopper (sm_90), for a few rows of
x, with a program's W rows brought into shared memory before the wait on the kernel before it.

At one token, Llama's o projection waits on the attention's merge, which waits on its split
kernel. The Triton GEMV in force (triton_gemv_residual.py) loads W into registers before its
wait: its first wave holds about 13 MB of the 33.6 MB weight (6 programs of 16 KiB an SM) and the
rest streams after the wait in 1.6 more waves, the last partial (session 26's profile). Shared
memory holds 227 KiB a program: here a program takes `rows` consecutive rows of W and copies them
by TMA in groups of `block_rows` rows into a ring of `num_stages` buffers, every buffer before
the wait. At 32 rows, 4 a group and 7 buffers, 128 programs (one an SM, one wave) hold 28.7 MB
before the wait; each refills one buffer after it. W is viewed as (rows, K / 256, 256), so that
a box of block_rows x num_warps x 256 lands as block_rows rows of a step's contiguous columns.
(Session 39's first build copied with cp.async, 16 bytes a thread: its profile, alone on an
H100, showed x's loads after the wait queued behind those copies in the L1 path, 45 % of the
stall samples on x's first use, and 58 % of DRAM peak. TMA's copies do not pass there.)

After the wait, x and the program's rows of r are asked of L1 (prefetch), then a group's rows
are dotted with each row of x on the CUDA cores: a thread reads 8 columns of each of the
group's rows from shared memory (16 bytes, a warp 512 contiguous bytes) against the same 8 of x,
a step of 256 columns a warp (`num_warps` 4 or 8); the sums cross the warps once a group. r is
added to the float32 sums before rounding. x and r are read, and y written, only after the
wait; the kernel after this one may launch right after it, or with `late_dependents` once the
products end.

Session 39 timed it on an H100 (write-up: docs/benchmarks/2026-12-01-h200-session39.md). Let in
right after the wait, the next kernel took 11 us more; `late_dependents` keeps it out until the
products end. Even so it lost in the Llama b1 block (0.973-0.986x): the copies before the wait
lengthen the GQA merge (0.5-4.6 us), and after the merge the o projection saves at most about
1 us. Per op it is 17.1 us at best against the Triton GEMV's 16.8, so the tables keep that.

Each row of x reads the ring again: it is for one row or a few. The ring takes as many buffers
as fit shared memory, `num_stages` at most (one at K 28672). Runs on sm_90 with bf16 or fp16
contiguous inputs, a 16-byte aligned W, K a positive multiple of a step and `rows` a multiple
of `block_rows`; anything else is a ValueError naming what (the Triton GEMV takes it). Gluon has
no interpreter: the CPU tests build it for sm_90, and the GPU tests check its outputs."""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LANGUAGE = "triton"
PARAMS = {
    "rows": [8, 16, 32, 64],
    "block_rows": [1, 2, 4, 8],
    "num_stages": [2, 3, 4, 5, 6, 7, 8, 12, 16],
    "late_dependents": [False, True],
    "num_warps": [4, 8],
}
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
COLUMNS = 256  # of a TMA box, its widest; a warp's columns a step
BOX = gl.constexpr(COLUMNS)


def step(warps: int) -> int:
    """Columns a step: 256 a warp (8 a thread, 32 threads)."""
    return COLUMNS * warps


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait: the kernel before this one has finished and its writes are seen."""
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _prefetch_l1(ptrs):
    """prefetch.global.L1 of each address's line (no register held, nothing read)."""
    gl.inline_asm_elementwise(
        "prefetch.global.L1 [$1]; // $0", "=r,l", [ptrs], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _copy_group(w_desc, ring, ready, stage, row0, STEPS: gl.constexpr):
    """A group's rows of W, from row0, into ring buffer `stage` by TMA (rows past N as zeros):
    a box of the group's rows x one step a copy, every copy counted on the buffer's barrier."""
    mbarrier.expect(ready.index(stage), STEPS * w_desc.block_type.nbytes)
    for c in gl.static_range(STEPS):
        tma_load(w_desc, [row0, c * w_desc.block_type.shape[1], 0], ready.index(stage),
                 ring.index(stage * STEPS + c))  # fmt: skip


@gluon.jit
def _dot_group(ring, stage, x_row, STEPS: gl.constexpr, GROUP: gl.constexpr,
               WARPS: gl.constexpr, LAYOUT: gl.constexpr):  # fmt: skip
    """The group's rows dotted with one row of x, in float32: a step is the group's rows x
    (warps x 256) columns, the 256 of warp w at [:, w, :]."""
    x_layout: gl.constexpr = gl.SliceLayout(0, LAYOUT)
    warp = gl.arange(0, WARPS, layout=gl.SliceLayout(1, x_layout))
    lane = gl.arange(0, BOX, layout=gl.SliceLayout(0, x_layout))
    cols = gl.expand_dims(warp * BOX, 1) + gl.expand_dims(lane, 0)
    acc = gl.zeros([GROUP, WARPS, BOX], gl.float32, LAYOUT)
    for c in gl.static_range(STEPS):
        w = ring.index(stage * STEPS + c).load(LAYOUT).to(gl.float32)
        x = gl.load(x_row + c * (WARPS * BOX) + cols).to(gl.float32)
        acc += w * gl.expand_dims(x, 0)
    return gl.sum(gl.sum(acc, axis=2), axis=1)


@gluon.jit
def _gemv_residual(w_desc, x_ptr, r_ptr, y_ptr, M, N, K: gl.constexpr, ROWS: gl.constexpr,
                   STAGES: gl.constexpr, LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    GROUP: gl.constexpr = w_desc.block_type.shape[0]
    WARPS: gl.constexpr = w_desc.block_type.shape[1]
    # A group's rows x a step: a thread 8 contiguous columns of every row, a warp 256.
    LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [1, WARPS, 1], [2, 1, 0])
    STEP: gl.constexpr = WARPS * BOX
    STEPS: gl.constexpr = K // STEP
    GROUPS: gl.constexpr = ROWS // GROUP
    n0 = gl.program_id(0) * ROWS
    # Buffer s, columns of step c: ring.index(s * STEPS + c), GROUP x WARPS x 256.
    ring = gl.allocate_shared_memory(
        w_desc.dtype, [STAGES * STEPS, GROUP, WARPS, BOX], w_desc.layout
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    fence_async_shared()
    cta_barrier()
    for g in gl.static_range(STAGES):  # every buffer before the wait
        _copy_group(w_desc, ring, ready, g, n0 + g * GROUP, STEPS)
    _gdc_wait()
    if not LATE_DEPENDENTS:
        _gdc_launch_dependents()
    # x and the program's r into L1 at once (a thread a 128-byte line), so that no group waits
    # on a global round trip.
    LINES: gl.constexpr = 32 * WARPS
    line = gl.arange(0, LINES, layout=gl.BlockedLayout([1], [32], [WARPS], [0])) * 64
    for m in range(M):
        for c in gl.static_range(triton.cdiv(K, LINES * 64)):
            _prefetch_l1(x_ptr + m * K + gl.minimum(c * LINES * 64 + line, K - 1))
        _prefetch_l1(r_ptr + m * N + gl.minimum(n0 + gl.minimum(line, ROWS - 1), N - 1))
    in_group = gl.arange(0, GROUP, layout=gl.SliceLayout(1, gl.SliceLayout(2, LAYOUT)))
    for g in range(GROUPS):
        stage = g % STAGES
        mbarrier.wait(ready.index(stage), (g // STAGES) & 1)
        rn = n0 + g * GROUP + in_group
        ok = rn < N
        for m in range(M):
            y = _dot_group(ring, stage, x_ptr + m * K, STEPS, GROUP, WARPS, LAYOUT)
            y += gl.load(r_ptr + m * N + rn, mask=ok, other=0.0).to(gl.float32)
            gl.store(y_ptr + m * N + rn, y.to(y_ptr.dtype.element_ty), mask=ok)
        if g + STAGES < GROUPS:
            cta_barrier()  # every warp is done with the buffer before it is refilled
            fence_async_shared()
            _copy_group(w_desc, ring, ready, stage, n0 + (g + STAGES) * GROUP, STEPS)
    if LATE_DEPENDENTS:
        _gdc_launch_dependents()


ROOM = 1024  # for the sums' reduction across the warps


def _buffer_bytes(k: int, block_rows: int) -> int:
    """A ring buffer of `block_rows` rows of W and its barrier."""
    return block_rows * k * 2 + 8


def shared_bytes(k: int, block_rows: int, stages: int) -> int:
    """Shared memory of a program: the ring of W rows, its barriers, with room for the sums'
    reduction."""
    return stages * _buffer_bytes(k, block_rows) + ROOM


def ring_stages(k: int, rows: int, block_rows: int, stages: int) -> int:
    """Buffers the ring takes: `stages` at most, no more than the program's groups, and as
    many as fit shared memory (0 where not even one does)."""
    fit = (SHARED_BYTES - ROOM) // _buffer_bytes(k, block_rows)
    return min(stages, rows // block_rows, fit)


def _refusal(x, w, r, rows: int, block_rows: int, stages: int, warps: int):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    if x.dtype not in (torch.bfloat16, torch.float16) or {w.dtype, r.dtype} != {x.dtype}:
        return f"needs bf16 or fp16 inputs of one dtype; got {x.dtype}, {w.dtype}, {r.dtype}"
    k = x.shape[1]
    if warps not in (4, 8):
        return f"num_warps {warps}: 4 or 8 only"
    if k == 0 or k % step(warps):
        return f"k {k}: a positive multiple of {step(warps)} only (a step at {warps} warps)"
    if block_rows not in (1, 2, 4, 8) or rows % block_rows:
        return f"rows {rows} in groups of block_rows {block_rows}: 1, 2, 4 or 8 dividing rows"
    if stages < 1:
        return f"num_stages {stages}: the ring needs a buffer"
    if ring_stages(k, rows, block_rows, stages) < 1:
        need = shared_bytes(k, block_rows, 1)
        return f"block_rows {block_rows} at k {k}: one buffer needs {need} bytes"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {x.device}"
    if w.device != x.device or r.device != x.device:
        return f"inputs on {x.device}, {w.device}, {r.device}"
    if w.data_ptr() % 16:
        return "needs a 16-byte aligned w (TMA)"
    return None


def _descriptor(w: torch.Tensor, block_rows: int, warps: int) -> TensorDescriptor:
    """TMA descriptor of W as (rows, K / 256, 256) in boxes of block_rows x warps x 256: a box
    lands in shared memory as block_rows rows of warps x 256 contiguous columns."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    n, k = w.shape
    shape, block = [n, k // COLUMNS, COLUMNS], [block_rows, warps, COLUMNS]
    return TensorDescriptor(w, shape, [k, COLUMNS, 1], block, layout)


def kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    rows: int = 32,
    block_rows: int = 4,
    num_stages: int = 7,
    late_dependents: bool = False,
    num_warps: int = 4,
) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if w.shape != (n, k) or r.shape != (m, n):
        raise ValueError(
            f"w must be (n, {k}) and r ({m}, n), got {tuple(w.shape)}, {tuple(r.shape)}"
        )
    x, w, r = x.contiguous(), w.contiguous(), r.contiguous()
    why = _refusal(x, w, r, rows, block_rows, num_stages, num_warps)
    if why is not None:
        raise ValueError(f"gluon GEMV + residual {why}; use triton_gemv_residual.py")
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y
    with torch.cuda.device(x.device):
        _gemv_residual[(triton.cdiv(n, rows),)](
            _descriptor(w, block_rows, num_warps), x, r, y, m, n, K=k, ROWS=rows,
            STAGES=ring_stages(k, rows, block_rows, num_stages),
            LATE_DEPENDENTS=bool(late_dependents), num_warps=num_warps, launch_pdl=True,
        )  # fmt: skip
    return y

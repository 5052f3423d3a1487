"""The skinny GEMM with its residual add (y = x W^T + r) in Gluon for Hopper (sm_90), for up to
16 rows of x a program: W streamed through a deep TMA ring by a loader warp of its own.

Session 25 profiled the Triton kernel (triton_gemm_residual.py) at 16 rows: it waits on memory
most of the time with about 64 KiB of W in flight an SM (cp.async, two steps ahead), where
cuBLAS's 16-row kernels keep a deeper TMA ring full from a producer warp. Here a program takes a
64-row tile of W (one wgmma is 64 rows tall: W is the left operand, x^T the right, 16 wide) and
one of `split_k` slices of K. One loader warp brings each K step's W tile and x tile by TMA into
a ring of `num_stages` buffers (128-byte swizzled, 64 columns a chunk); one warpgroup multiplies
them into a 64 x 16 float32 accumulator and gives each buffer back. With one slice the program
adds the residual and writes y; with more, it stores its float32 partial tile and the last of a
tile's programs to arrive (an acq_rel count after a barrier that puts the tile's stores first)
adds the slices' partials in a fixed order, adds r, writes y and resets the count, as the Triton
kernel does.

Launched with programmatic dependent launch: the loader asks for the ring's first W tiles, which
nothing earlier in the stream writes, before griddepcontrol.wait, and for x only after it; r is
read and anything written only after the wait. The kernel after this one may launch right after
the wait, or with `late_dependents` only once the products end. `residual_ahead` loads the
warpgroup's r right after its wait, so that the program that writes y does not wait for r after
the products: with one slice nothing else is loaded there, and r's round trip to memory would be
the last thing each 16-row o or down kernel of a layer waits for (session 44, in the Llama b16
block on an H100: 1.002x at four layers, 1.000x at 32; on the H200, session 47: 1.002-1.003x at
four layers and 1.002x at 32, in the block tables in force since). `programs_per_sm`
caps a thread's registers so that two or three programs share an SM.

Runs on sm_90 with bf16 or fp16 contiguous inputs, K a multiple of 8 (TMA's 16-byte strides) and
16-byte aligned x and w; anything else is a ValueError naming what (the Triton candidate takes
it). Gluon has no interpreter: the CPU tests build it for sm_90, and the GPU tests check its
outputs."""

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LANGUAGE = "triton"
PARAMS = {
    "block_k": [64, 128, 256],
    "split_k": [1, 2, 3, 4, 8],
    "num_stages": [2, 3, 4, 5, 6, 8, 10, 12, 16, 20],
    "late_dependents": [False, True],
    "residual_ahead": [False, True],
    "programs_per_sm": [1, 2, 3],
}
# A thread's register cap (Triton's maxnreg) that lets n programs of two warpgroups share an
# SM's 64K registers. Uncapped, the warp-specialized build takes 255 a thread, one program an
# SM whatever its shared memory (session 37's profile of its x g siblings): past one wave of
# tiles x slices, a second wave. Capped, the loader's setmaxnreg budget stays 24. Session 38
# timed capped configurations: slower than the uncapped one in force at every shape swept
# (each program's fixed costs, not occupancy, bound this kernel).
REGISTER_CAPS = {1: None, 2: 128, 3: 80}
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
ROWS_W = 64  # W rows a program: one wgmma is 64 rows tall
ROWS_X = 16  # x rows a program: the wgmma's width
CHUNK = 64  # columns of a shared-memory chunk (a 128-byte swizzled row)
BLOCK_W = gl.constexpr(ROWS_W)
BLOCK_X = gl.constexpr(ROWS_X)
TILE = ROWS_W * ROWS_X
# The epilogue's layout of a tile (W rows x x rows): a warp's lanes down 32 W rows, the four
# warps each every fourth x row.
OUT_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1]))


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
def _loader(w_desc, x_desc, w_smem, x_smem, ready, free, n0, m0, k0, n_steps,
            CHUNKS: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: the first buffers' W tiles before the wait, their x tiles after it, then each
    step's W and x as soon as the warpgroup has given its buffer back (a fresh barrier passes
    the first wait, parity 1)."""
    step_bytes: gl.constexpr = CHUNKS * (w_desc.block_type.nbytes + x_desc.block_type.nbytes)
    early = gl.minimum(n_steps, STAGES)
    for j in range(early):
        mbarrier.expect(ready.index(j), step_bytes)
        for c in gl.static_range(CHUNKS):
            k = k0 + (j * CHUNKS + c) * 64
            tma_load(w_desc, [n0, k], ready.index(j), w_smem.index(j * CHUNKS + c))
    _gdc_wait()
    for j in range(early):
        for c in gl.static_range(CHUNKS):
            k = k0 + (j * CHUNKS + c) * 64
            tma_load(x_desc, [m0, k], ready.index(j), x_smem.index(j * CHUNKS + c))
    for j in range(early, n_steps):
        stage = j % STAGES
        mbarrier.wait(free.index(stage), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), step_bytes)
        for c in gl.static_range(CHUNKS):
            k = k0 + (j * CHUNKS + c) * 64
            tma_load(w_desc, [n0, k], ready.index(stage), w_smem.index(stage * CHUNKS + c))
            tma_load(x_desc, [m0, k], ready.index(stage), x_smem.index(stage * CHUNKS + c))


@gluon.jit
def _products(w_smem, x_smem, ready, free, n_steps, r_ptr, y_ptr, part_ptr, count_ptr, M, N, n0,
              m0, tile, split, CHUNKS: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr,
              LATE_DEPENDENTS: gl.constexpr, RESIDUAL_AHEAD: gl.constexpr):  # fmt: skip
    """One warpgroup: acc (64 W rows x 16 x rows) += W_tile x_tile^T over the slice's steps,
    each buffer given back once its products are done; then the epilogue. With RESIDUAL_AHEAD
    it loads its tile of r first, right after the wait."""
    _gdc_wait()
    if not LATE_DEPENDENTS:
        _gdc_launch_dependents()
    if RESIDUAL_AHEAD:  # noqa: SIM108 (a constexpr branch)
        r = _residual(r_ptr, M, N, n0, m0)
    else:
        r = 0  # loaded by the epilogue
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_X, 16]
    )
    acc = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, layout)
    for j in range(n_steps):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        for c in gl.static_range(CHUNKS):
            i = stage * CHUNKS + c
            acc = warpgroup_mma(w_smem.index(i), x_smem.index(i).permute((1, 0)), acc,
                                is_async=True)  # fmt: skip
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(free.index(stage))
    if LATE_DEPENDENTS:
        _gdc_launch_dependents()
    _epilogue(acc, r, r_ptr, y_ptr, part_ptr, count_ptr, M, N, n0, m0, tile, split, SPLITS,
              RESIDUAL_AHEAD)  # fmt: skip


@gluon.jit
def _out_cells(M, N, n0, m0):
    """The tile's cells of y (and r) in the epilogue's layout: offsets, bounds, and the W-row
    and x-row indices within the tile."""
    i = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, OUT_LAYOUT))
    j = gl.arange(0, BLOCK_X, layout=gl.SliceLayout(0, OUT_LAYOUT))
    rn, rm = n0 + i, m0 + j
    out_ok = gl.expand_dims(rn < N, 1) & gl.expand_dims(rm < M, 0)
    out = gl.expand_dims(rm.to(gl.int64) * N, 0) + gl.expand_dims(rn, 1)
    return out, out_ok, i, j


@gluon.jit
def _residual(r_ptr, M, N, n0, m0):
    """The tile's r in the epilogue's layout."""
    out, out_ok, _, _ = _out_cells(M, N, n0, m0)
    return gl.load(r_ptr + out, mask=out_ok, other=0.0)


@gluon.jit
def _epilogue(acc, r, r_ptr, y_ptr, part_ptr, count_ptr, M, N, n0, m0, tile, split,
              SPLITS: gl.constexpr, RESIDUAL_AHEAD: gl.constexpr):  # fmt: skip
    """acc[i, j] is y[m0 + j, n0 + i] before r: with one slice, add r and write y; with more,
    store the partial tile, and the last of the tile's programs to count adds them all. r is
    the tile's r when loaded ahead, else loaded here."""
    out, out_ok, i, j = _out_cells(M, N, n0, m0)
    acc = gl.convert_layout(acc, OUT_LAYOUT)
    done = SPLITS == 1
    if SPLITS > 1:
        cell = gl.expand_dims(i * BLOCK_X, 1) + gl.expand_dims(j, 0)
        tile_parts = part_ptr + tile.to(gl.int64) * (SPLITS * BLOCK_W * BLOCK_X) + cell
        gl.store(tile_parts + split * (BLOCK_W * BLOCK_X), acc)
        cta_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == SPLITS - 1
        if done:
            gl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            acc = gl.load(tile_parts)
            for s in gl.static_range(1, SPLITS):
                acc += gl.load(tile_parts + s * (BLOCK_W * BLOCK_X))
    if done:
        if RESIDUAL_AHEAD:
            acc += r.to(gl.float32)
        else:
            acc += gl.load(r_ptr + out, mask=out_ok, other=0.0).to(gl.float32)
        gl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=out_ok)


@gluon.jit
def _gemm_residual(w_desc, x_desc, r_ptr, y_ptr, part_ptr, count_ptr, M, N, K, steps_per_split,
                   BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr,
                   LATE_DEPENDENTS: gl.constexpr, RESIDUAL_AHEAD: gl.constexpr):  # fmt: skip
    pid_n, pid_s, pid_m = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    n0 = pid_n * BLOCK_W
    m0 = pid_m * BLOCK_X
    tile = pid_m * gl.num_programs(0) + pid_n
    CHUNKS: gl.constexpr = BLOCK_K // 64
    first = pid_s * steps_per_split
    n_steps = gl.minimum(steps_per_split, gl.cdiv(K, BLOCK_K) - first)
    k0 = first * BLOCK_K

    dtype: gl.constexpr = w_desc.dtype
    w_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_W, 64], w_desc.layout)
    x_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_X, 64], x_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    fence_async_shared()
    cta_barrier()
    gl.warp_specialize(
        [
            (_products, (w_smem, x_smem, ready, free, n_steps, r_ptr, y_ptr, part_ptr, count_ptr,
                         M, N, n0, m0, tile, pid_s, CHUNKS, STAGES, SPLITS, LATE_DEPENDENTS,
                         RESIDUAL_AHEAD)),
            (_loader, (w_desc, x_desc, w_smem, x_smem, ready, free, n0, m0, k0, n_steps, CHUNKS,
                       STAGES)),
        ],
        [1],
        [24],
    )  # fmt: skip


# The arrival counts, per device: zero between calls (the last program of a tile resets its
# count). Every buffer is kept, as a CUDA graph may hold any of them.
_COUNTS: dict[torch.device, list[torch.Tensor]] = {}


def _arrival_counts(n: int, device: torch.device) -> torch.Tensor:
    held = _COUNTS.setdefault(device, [])
    if held and held[-1].numel() >= n:
        return held[-1]
    if torch.cuda.is_current_stream_capturing():
        # A buffer made while a graph is captured is zeroed only when the graph replays: this
        # call's graph zeroes its own counts, and no other call shares them.
        return torch.zeros(n, dtype=torch.int32, device=device)
    size = max(n, 2 * held[-1].numel() if held else 0)
    held.append(torch.zeros(size, dtype=torch.int32, device=device))
    return held[-1]


def shared_bytes(block_k: int, stages: int) -> int:
    """Shared memory of a program: the ring of W and x tiles, its barriers, the epilogue's
    float32 tile (its change of layout), with room."""
    return stages * block_k * (ROWS_W + ROWS_X) * 2 + 16 * stages + TILE * 4 + 1024


def slice_steps(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(K steps a slice, slices): whole steps a slice and no empty slice."""
    steps = triton.cdiv(k, block_k)
    per = triton.cdiv(steps, max(1, split_k))
    return per, triton.cdiv(steps, per)


def _refusal(x, w, r, block_k: int, stages: int, programs: int):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    if x.dtype not in (torch.bfloat16, torch.float16) or {w.dtype, r.dtype} != {x.dtype}:
        return f"needs bf16 or fp16 inputs of one dtype; got {x.dtype}, {w.dtype}, {r.dtype}"
    if block_k not in (64, 128, 256):
        return f"block_k {block_k}: 64, 128 or 256 only"
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if shared_bytes(block_k, stages) > SHARED_BYTES:
        return f"block_k {block_k} at {stages} stages needs {shared_bytes(block_k, stages)} bytes"
    if programs not in REGISTER_CAPS:
        return f"programs_per_sm {programs}: 1, 2 or 3 only"
    k = x.shape[1]
    if k % 8:
        return f"k {k}: a multiple of 8 only (TMA's 16-byte row strides)"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "needs 16-byte aligned x and w (TMA)"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {x.device}"
    if w.device != x.device or r.device != x.device:
        return f"inputs on {x.device}, {w.device}, {r.device}"
    return None


@functools.cache
def _layout(rows: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for(
        [rows, CHUNK], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    )


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of the contiguous matrix `t` in rows x 64 tiles (out of bounds reads give
    zeros). Its row stride is its width, also where torch keeps another for a single row."""
    return TensorDescriptor(
        t, list(t.shape), [t.shape[1], 1], [rows, CHUNK], _layout(rows, t.dtype)
    )


def kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    block_k: int = 128,
    split_k: int = 2,
    num_stages: int = 8,
    late_dependents: bool = False,
    programs_per_sm: int = 1,
    residual_ahead: bool = False,
) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if w.shape != (n, k) or r.shape != (m, n):
        raise ValueError(
            f"w must be (n, {k}) and r ({m}, n), got {tuple(w.shape)}, {tuple(r.shape)}"
        )
    x, w, r = x.contiguous(), w.contiguous(), r.contiguous()
    why = _refusal(x, w, r, block_k, num_stages, programs_per_sm)
    if why is not None:
        raise ValueError(f"gluon GEMM + residual {why}; use triton_gemm_residual.py")
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y
    if k == 0:  # an empty product: the residual alone
        return y.copy_(r)
    steps, splits = slice_steps(k, block_k, split_k)
    grid = (triton.cdiv(n, ROWS_W), splits, triton.cdiv(m, ROWS_X))
    tiles = grid[0] * grid[2]
    if splits > 1:
        parts = torch.empty(tiles * splits * TILE, device=x.device, dtype=torch.float32)
        counts = _arrival_counts(tiles, x.device)
    else:
        parts = counts = y  # not read
    with torch.cuda.device(x.device):
        _gemm_residual[grid](
            _descriptor(w, ROWS_W), _descriptor(x, ROWS_X), r, y, parts, counts, m, n, k, steps,
            BLOCK_K=block_k, STAGES=num_stages, SPLITS=splits,
            LATE_DEPENDENTS=bool(late_dependents), RESIDUAL_AHEAD=bool(residual_ahead),
            num_warps=4, launch_pdl=True,
            maxnreg=REGISTER_CAPS[programs_per_sm],
        )  # fmt: skip
    return y

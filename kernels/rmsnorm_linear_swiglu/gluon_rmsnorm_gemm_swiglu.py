"""RMSNorm, the gate and up projections and SwiGLU in Gluon for Hopper (sm_90), for up to 16 rows
of x a program: y = silu(s * (x g) W_g^T) * (s * (x g) W_u^T), s = rsqrt(mean(x^2) + eps), with
W streamed through a TMA ring by a loader warp of its own.

Session 35 built this op in Gluon twice and both lost to the Triton kernel
(triton_rmsnorm_gemm_swiglu.py): each K step's x g was written on the ring's critical path. This
is the third shape, that of gluon_rmsnorm_gemm_rope.py: a program writes the x g of its whole K
slice into shared memory once (x g over x in place, rounded to x's dtype as the eager norm
rounds; 32 KiB at 16 rows and a 1024-wide slice), with the slice's sum of x^2, and the ring
carries W alone. The warpgroup loads the slice's g before the wait for the kernel before this
one (g and W are never written by a kernel); the loader warp fills the ring with W before that
wait and brings the slice's x by TMA after it.

A program takes 64 output columns: the gate's rows n.. n + 63 and the up projection's rows
f + n.. f + n + 63 of W, in two 64-row wgmma accumulators (W is the left operand), so a column's
gate and up sit in the same thread's registers; 16 rows of x (the wgmma's width) and one of
`split_k` slices of K. With one slice it applies the norm's scale and SwiGLU and writes y; with
more, it stores its float32 partials and x^2 sums, and the last of a tile's programs to arrive
(an acq_rel count behind the warpgroup's barrier) adds them in a fixed order, runs the epilogue
and resets the count.

Runs on sm_90 with bf16 or fp16 contiguous x, g and w, K a multiple of 8 (TMA's 16-byte strides)
and 16-byte aligned x and w; anything else is a ValueError naming what (the Triton candidate
takes it). Gluon has no interpreter: the CPU tests build it for sm_90, with the device's Triton
3.6.0 too (tests/kernels/test_device_triton.py); its GPU tests are written and not yet run
(session 36 had no device)."""

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
    "block_k": [64, 128],
    "split_k": [1, 2, 4, 8],
    "num_stages": [2, 3, 4, 6, 8],
    "late_dependents": [False, True],
    "programs_per_sm": [1, 2, 3],
}
# A thread's register cap (Triton's maxnreg) that lets n programs of two warpgroups share an
# SM's 64K registers. Uncapped, a warp-specialized build takes 255 a thread, the whole file:
# one program an SM whatever its shared memory (session 37's profile of the qkv kernel).
# Capped, the partitions' setmaxnreg budgets shrink with it (the loader's to 24). Session 38
# timed capped configurations: none beat the kernel in force at its shape.
REGISTER_CAPS = {1: None, 2: 128, 3: 80}
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
EPS = 1e-6
ROWS_W = 64  # W rows of each of a program's two tiles: one wgmma is 64 rows tall
ROWS_X = 16  # x rows a program: the wgmma's width
CHUNK = 64  # columns of a shared-memory chunk (a 128-byte swizzled row)
BLOCK_W = gl.constexpr(ROWS_W)
BLOCK_X = gl.constexpr(ROWS_X)
TILE = ROWS_W * ROWS_X
TILE_CELLS = gl.constexpr(TILE)


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
def _w_step(w_desc, w_smem, ready, row_gate, row_up, k0, j, stage,
            CHUNKS: gl.constexpr):  # fmt: skip
    """Step j's two W tiles into the ring's buffer `stage`."""
    step_bytes: gl.constexpr = CHUNKS * 2 * w_desc.block_type.nbytes
    mbarrier.expect(ready.index(stage), step_bytes)
    for c in gl.static_range(CHUNKS):
        k = k0 + (j * CHUNKS + c) * 64
        i = 2 * (stage * CHUNKS + c)
        tma_load(w_desc, [row_gate, k], ready.index(stage), w_smem.index(i))
        tma_load(w_desc, [row_up, k], ready.index(stage), w_smem.index(i + 1))


@gluon.jit
def _loader(w_desc, x_desc, w_smem, xg_smem, ready, free, x_bar, row_gate, row_up, m0, k0,
            n_steps, SLICE_CHUNKS: gl.constexpr, CHUNKS: gl.constexpr,
            STAGES: gl.constexpr):  # fmt: skip
    """One warp: the ring's first W tiles before the wait for the kernel before this one (W is
    never written by a kernel), the slice's x after it (16 rows x SLICE_CHUNKS * 64 columns,
    zeros past M and K, on one barrier), then each step's W as soon as the warpgroup has given
    its buffer back (a fresh barrier passes the first wait, parity 1). The warpgroup needs x
    before it gives any buffer back, so the wait costs the loader nothing."""
    early = gl.minimum(n_steps, STAGES)
    for j in range(early):
        _w_step(w_desc, w_smem, ready, row_gate, row_up, k0, j, j, CHUNKS)
    _gdc_wait()
    mbarrier.expect(x_bar, SLICE_CHUNKS * x_desc.block_type.nbytes)
    for c in gl.static_range(SLICE_CHUNKS):
        tma_load(x_desc, [m0, k0 + c * 64], x_bar, xg_smem.index(c))
    for j in range(early, n_steps):
        stage = j % STAGES
        mbarrier.wait(free.index(stage), ((j // STAGES) & 1) ^ 1)
        _w_step(w_desc, w_smem, ready, row_gate, row_up, k0, j, stage, CHUNKS)


@gluon.jit
def _load_g(g_ptr, g_smem, K, k0, SLICE_CHUNKS: gl.constexpr, G_SPAN: gl.constexpr):
    """The slice's g into shared memory (zeros past the slice and K) in one load: g is never
    written by a kernel, so this comes before the wait for the kernel before this one."""
    g_layout: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
    span = gl.arange(0, G_SPAN, layout=g_layout)
    k = k0 + span
    g_smem.store(gl.load(g_ptr + k, mask=(k < K) & (span < SLICE_CHUNKS * 64), other=0.0))


@gluon.jit
def _write_xg(xg_smem, g_smem, x_bar, SLICE_CHUNKS: gl.constexpr):
    """The slice's x g into shared memory over the x the loader brought, rounded to x's dtype;
    returns each row's sum of x^2 over the slice."""
    mbarrier.wait(x_bar, 0)
    cta_barrier()  # every thread's g in shared memory before any reads it
    # A chunk at a time, with a barrier or two a chunk: the compiler cannot see that a thread
    # writes only what it read. Several chunks a load and a store would take a rank-3 view of
    # the buffer, which Triton 3.6 gives only through a private method (the evaluator refuses
    # those), or unrolled K loops (which spilled). By estimate the loop runs in about 1 us at 16
    # chunks, while the ring's first W tiles (64 KiB a program) take longer than that to arrive.
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    g_row: gl.constexpr = gl.SliceLayout(0, x_layout)
    squares = gl.zeros([BLOCK_X], gl.float32, gl.SliceLayout(1, x_layout))
    for c in gl.static_range(SLICE_CHUNKS):
        xf = xg_smem.index(c).load(x_layout).to(gl.float32)
        gf = g_smem.slice(c * 64, 64).load(g_row).to(gl.float32)
        squares += gl.sum(xf * xf, axis=1)
        xg_smem.index(c).store((xf * gl.expand_dims(gf, 0)).to(xg_smem.dtype))
    fence_async_shared()
    cta_barrier()  # every thread's x g in shared memory before the products read it
    return squares


@gluon.jit
def _products(w_smem, xg_smem, g_smem, x_bar, ready, free, n_steps, g_ptr, y_ptr,
              part_ptr, squares_ptr, count_ptr, M, F, K, k0, m0, n0, tile, split, eps,
              CHUNKS: gl.constexpr, STAGES: gl.constexpr, SLICE_CHUNKS: gl.constexpr,
              G_SPAN: gl.constexpr, SPLITS: gl.constexpr,
              LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    """One warpgroup: g before the wait for the kernel before this one, the slice's x g once x
    has come, then the gate's and up's sums over the slice's steps; then the epilogue."""
    _load_g(g_ptr, g_smem, K, k0, SLICE_CHUNKS, G_SPAN)
    _gdc_wait()
    if not LATE_DEPENDENTS:
        _gdc_launch_dependents()
    squares = _write_xg(xg_smem, g_smem, x_bar, SLICE_CHUNKS)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_X, 16]
    )
    gate = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, acc_layout)
    up = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, acc_layout)
    for j in range(n_steps):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        for c in gl.static_range(CHUNKS):
            i = 2 * (stage * CHUNKS + c)
            xg = xg_smem.index(j * CHUNKS + c).permute((1, 0))
            gate = warpgroup_mma(w_smem.index(i), xg, gate, is_async=True)
            up = warpgroup_mma(w_smem.index(i + 1), xg, up, is_async=True)
        gate, up = warpgroup_mma_wait(num_outstanding=0, deps=(gate, up))
        mbarrier.arrive(free.index(stage))
    if LATE_DEPENDENTS:
        _gdc_launch_dependents()

    # gate[i, j], up[i, j]: row m0 + j's sums for output column n0 + i.
    out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1])
    gate = gl.convert_layout(gate, out_layout)
    up = gl.convert_layout(up, out_layout)
    squares = gl.convert_layout(squares, gl.SliceLayout(0, out_layout))
    lane = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
    rm = m0 + gl.arange(0, BLOCK_X, layout=gl.SliceLayout(0, out_layout))
    done = SPLITS == 1
    if SPLITS > 1:
        cell = gl.expand_dims(lane * BLOCK_X, 1) + gl.expand_dims(rm - m0, 0)
        parts = part_ptr + tile.to(gl.int64) * (SPLITS * 2 * TILE_CELLS) + cell
        sums = squares_ptr + tile.to(gl.int64) * (SPLITS * BLOCK_X) + (rm - m0)
        gl.store(parts + split * (2 * TILE_CELLS), gate)
        gl.store(parts + split * (2 * TILE_CELLS) + TILE_CELLS, up)
        gl.store(sums + split * BLOCK_X, squares)
        cta_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == SPLITS - 1
        if done:
            gl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            gate = gl.load(parts)
            up = gl.load(parts + TILE_CELLS)
            squares = gl.load(sums)
            for s in gl.static_range(1, SPLITS):
                gate += gl.load(parts + s * (2 * TILE_CELLS))
                up += gl.load(parts + s * (2 * TILE_CELLS) + TILE_CELLS)
                squares += gl.load(sums + s * BLOCK_X)
    if done:
        scale = gl.expand_dims(gl.rsqrt(squares / K + eps), 0)
        gate, up = gate * scale, up * scale
        y = gate / (1.0 + gl.exp(-gate)) * up  # Gluon has no sigmoid
        out = gl.expand_dims(rm.to(gl.int64) * F, 0) + gl.expand_dims(n0 + lane, 1)
        ok = gl.expand_dims(rm < M, 0) & gl.expand_dims(n0 + lane < F, 1)
        gl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=ok)


@gluon.jit
def _rmsnorm_gemm_swiglu(w_desc, x_desc, g_ptr, y_ptr, part_ptr, squares_ptr, count_ptr, M, F, K,
                         eps, BLOCK_K: gl.constexpr, STEPS: gl.constexpr, G_SPAN: gl.constexpr,
                         STAGES: gl.constexpr, SPLITS: gl.constexpr,
                         LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    pid_n, pid_s, pid_m = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    m0 = pid_m * BLOCK_X
    n0 = pid_n * BLOCK_W
    tile = pid_m * gl.num_programs(0) + pid_n
    CHUNKS: gl.constexpr = BLOCK_K // 64
    SLICE_CHUNKS: gl.constexpr = BLOCK_K // 64 * STEPS
    first = pid_s * STEPS
    n_steps = gl.minimum(STEPS, gl.cdiv(K, BLOCK_K) - first)
    k0 = first * BLOCK_K

    dtype: gl.constexpr = w_desc.dtype
    w_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS * 2, BLOCK_W, 64], w_desc.layout)
    xg_smem = gl.allocate_shared_memory(dtype, [SLICE_CHUNKS, BLOCK_X, 64], x_desc.layout)
    g_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    g_smem = gl.allocate_shared_memory(dtype, [G_SPAN], g_layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    x_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    mbarrier.init(x_bar, count=1)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    fence_async_shared()
    cta_barrier()
    gl.warp_specialize(
        [
            (_products, (w_smem, xg_smem, g_smem, x_bar, ready, free, n_steps, g_ptr,
                         y_ptr, part_ptr, squares_ptr, count_ptr, M, F, K, k0, m0, n0, tile,
                         pid_s, eps, CHUNKS, STAGES, SLICE_CHUNKS, G_SPAN, SPLITS,
                         LATE_DEPENDENTS)),
            (_loader, (w_desc, x_desc, w_smem, xg_smem, ready, free, x_bar, n0, F + n0, m0, k0,
                       n_steps, SLICE_CHUNKS, CHUNKS, STAGES)),
        ],
        [1],
        [40],
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


def slice_steps(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(K steps a slice, slices): whole steps a slice and no empty slice."""
    steps = triton.cdiv(k, block_k)
    per = triton.cdiv(steps, max(1, split_k))
    return per, triton.cdiv(steps, per)


def shared_bytes(k: int, block_k: int, split_k: int, stages: int) -> int:
    """Shared memory of a program: the ring of W tile pairs, the slice's x g and g, the
    epilogue's two float32 tiles (their change of layout), barriers, with room."""
    per, _ = slice_steps(k, block_k, split_k)
    ring = stages * block_k * 2 * ROWS_W * 2
    x_g = per * block_k * ROWS_X * 2 + triton.next_power_of_2(per * block_k) * 2
    return ring + x_g + 2 * TILE * 4 + 16 * stages + 1024


def _refusal(x, g, w, block_k: int, split_k: int, stages: int, programs: int):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    tensors = (x, g, w)
    if x.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != x.dtype for t in tensors):
        return f"needs bf16 or fp16 x, g and w of one dtype; got {[t.dtype for t in tensors]}"
    if block_k not in (64, 128):
        return f"block_k {block_k}: 64 or 128 only"
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if programs not in REGISTER_CAPS:
        return f"programs_per_sm {programs}: 1, 2 or 3 only"
    k = x.shape[1]
    if k % 8:
        return f"k {k}: a multiple of 8 only (TMA's 16-byte row strides)"
    need = shared_bytes(k, block_k, split_k, stages)
    if need > SHARED_BYTES:
        return f"k {k} in {split_k} slices at block_k {block_k}, {stages} stages needs {need} bytes"
    if any(t.data_ptr() % 16 for t in (x, w)):
        return "needs 16-byte aligned x and w (TMA)"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {x.device}"
    if any(t.device != x.device for t in tensors):
        return f"inputs on {[str(t.device) for t in tensors]}: one device only"
    return None


@functools.cache
def _layout(rows: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for(
        [rows, CHUNK], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    )


def _descriptor(t: torch.Tensor, rows: int = ROWS_W) -> TensorDescriptor:
    """TMA descriptor of the contiguous matrix `t` in rows x 64 tiles (out of bounds reads give
    zeros). Its row stride is its width, also where torch keeps another for a single row."""
    return TensorDescriptor(
        t, list(t.shape), [t.shape[1], 1], [rows, CHUNK], _layout(rows, t.dtype)
    )


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w: torch.Tensor,
    block_k: int = 64,
    split_k: int = 4,
    num_stages: int = 4,
    late_dependents: bool = False,
    programs_per_sm: int = 1,
) -> torch.Tensor:
    m, k = x.shape
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w must be (2f, {k}) and g ({k},), got {tuple(w.shape)}, {tuple(g.shape)}"
        )
    f = w.shape[0] // 2
    if k == 0:
        raise ValueError("x must have at least one column: the norm of an empty row is undefined")
    x, g, w = x.contiguous(), g.contiguous(), w.contiguous()
    why = _refusal(x, g, w, block_k, split_k, num_stages, programs_per_sm)
    if why is not None:
        raise ValueError(
            f"gluon RMSNorm + gate/up + SwiGLU {why}; use triton_rmsnorm_gemm_swiglu.py"
        )
    y = torch.empty((m, f), device=x.device, dtype=x.dtype)
    if m == 0 or f == 0:
        return y
    steps, splits = slice_steps(k, block_k, split_k)
    grid = (triton.cdiv(f, ROWS_W), splits, triton.cdiv(m, ROWS_X))
    tiles = grid[0] * grid[2]
    if splits > 1:
        parts = torch.empty(tiles * splits * 2 * TILE, device=x.device, dtype=torch.float32)
        squares = torch.empty(tiles * splits * ROWS_X, device=x.device, dtype=torch.float32)
        counts = _arrival_counts(tiles, x.device)
    else:
        parts = squares = counts = y  # not read
    with torch.cuda.device(x.device):
        _rmsnorm_gemm_swiglu[grid](
            _descriptor(w), _descriptor(x, ROWS_X), g, y, parts, squares, counts, m, f, k, EPS,
            BLOCK_K=block_k, STEPS=steps, G_SPAN=triton.next_power_of_2(steps * block_k),
            STAGES=num_stages, SPLITS=splits, LATE_DEPENDENTS=bool(late_dependents), num_warps=4,
            launch_pdl=True, maxnreg=REGISTER_CAPS[programs_per_sm],
        )  # fmt: skip
    return y

"""RMSNorm, the q/k/v projection and rope in Gluon for Hopper (sm_90), for up to 16 rows of x a
program: qk = rope(s * (x g) W_qk^T) and v = s * (x g) W_v^T, s = rsqrt(mean(x^2) + eps), with W
streamed through a TMA ring by a loader warp of its own.

At 16 rows the Triton kernel (triton_rmsnorm_gemm_rope.py) holds the largest share of what the
Llama b16 layer loses to copy (session 35, call 10). gluon_gemm_residual.py, fed the same way,
won in the b16 blocks; a SwiGLU kernel that wrote each K step's x g on the ring's critical path
lost. So here a program writes the x g of its whole K slice into shared memory once (x g over
x in place, rounded to x's dtype as the eager norm rounds; 32 KiB at 16 rows and a 1024-wide
slice), with the slice's sum of x^2, and the ring carries W alone. The warpgroup loads the
slice's g before the wait for the kernel before this one (g and W are never written by a
kernel); the loader warp fills the ring with W before that wait and brings the slice's x by
TMA after it.

A q/k program takes 64 rotation pairs of one head (rows j and j + d/2 of W_qk, which rope mixes:
two 64-row wgmma accumulators, so each pair sits in the same thread's registers), a v program
two tiles of 64 consecutive rows of W_v; each takes 16 rows of x (the wgmma's width; W is the
left operand) and one of `split_k` slices of K. With one slice it applies the norm's scale and
the rotation (v programs rotate by nothing) and writes; with more, it stores its float32
partials and x^2 sums, and the last of a tile's programs to arrive (an acq_rel count behind the
warpgroup's barrier) adds them in a fixed order, runs the epilogue and resets the count.

Runs on sm_90 with bf16 or fp16 contiguous x, g and weights, head_dim / 2 a multiple of 64, K a
multiple of 8 (TMA's 16-byte strides) and 16-byte aligned x and weights; anything else is a
ValueError naming what (the Triton candidate takes it). Gluon has no interpreter: the CPU tests
build it for sm_90, with the device's Triton 3.6.0 too (tests/kernels/test_device_triton.py); its
GPU tests are written and not yet run (sessions 35 and 36 had no device time for it)."""

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
# one program an SM whatever its shared memory (session 37's profile). Capped, the
# partitions' setmaxnreg budgets shrink with it (24 and 216 at 128, 24 and 120 at 80). Session
# 38 timed capped configurations: none beat the kernel in force at its shape.
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
def _w_step(wqk_desc, wv_desc, w_smem, ready, is_qk, row_a, row_b, k0, j, stage,
            CHUNKS: gl.constexpr):  # fmt: skip
    """Step j's two W tiles into the ring's buffer `stage`."""
    step_bytes: gl.constexpr = CHUNKS * 2 * wqk_desc.block_type.nbytes
    mbarrier.expect(ready.index(stage), step_bytes)
    for c in gl.static_range(CHUNKS):
        k = k0 + (j * CHUNKS + c) * 64
        i = 2 * (stage * CHUNKS + c)
        if is_qk:
            tma_load(wqk_desc, [row_a, k], ready.index(stage), w_smem.index(i))
            tma_load(wqk_desc, [row_b, k], ready.index(stage), w_smem.index(i + 1))
        else:
            tma_load(wv_desc, [row_a, k], ready.index(stage), w_smem.index(i))
            tma_load(wv_desc, [row_b, k], ready.index(stage), w_smem.index(i + 1))


@gluon.jit
def _loader(wqk_desc, wv_desc, x_desc, w_smem, xg_smem, ready, free, x_bar, is_qk, row_a,
            row_b, m0, k0, n_steps, SLICE_CHUNKS: gl.constexpr, CHUNKS: gl.constexpr,
            STAGES: gl.constexpr):  # fmt: skip
    """One warp: the ring's first W tiles before the wait for the kernel before this one (W is
    never written by a kernel), the slice's x after it (16 rows x SLICE_CHUNKS * 64 columns,
    zeros past M and K, on one barrier), then each step's W as soon as the warpgroup has given
    its buffer back (a fresh barrier passes the first wait, parity 1). The warpgroup needs x
    before it gives any buffer back, so the wait costs the loader nothing."""
    early = gl.minimum(n_steps, STAGES)
    for j in range(early):
        _w_step(wqk_desc, wv_desc, w_smem, ready, is_qk, row_a, row_b, k0, j, j, CHUNKS)
    _gdc_wait()
    mbarrier.expect(x_bar, SLICE_CHUNKS * x_desc.block_type.nbytes)
    for c in gl.static_range(SLICE_CHUNKS):
        tma_load(x_desc, [m0, k0 + c * 64], x_bar, xg_smem.index(c))
    for j in range(early, n_steps):
        stage = j % STAGES
        mbarrier.wait(free.index(stage), ((j // STAGES) & 1) ^ 1)
        _w_step(wqk_desc, wv_desc, w_smem, ready, is_qk, row_a, row_b, k0, j, stage, CHUNKS)


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
def _products(w_smem, xg_smem, g_smem, x_bar, ready, free, n_steps, g_ptr, cos_ptr, sin_ptr,
              qk_ptr, v_ptr, part_ptr, squares_ptr, count_ptr, M, K, N_QK, N_V, k0, m0, is_qk,
              row_a, row_b, pair0, tile, split, eps, HALF: gl.constexpr, CHUNKS: gl.constexpr,
              STAGES: gl.constexpr, SLICE_CHUNKS: gl.constexpr, G_SPAN: gl.constexpr,
              SPLITS: gl.constexpr,
              LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    """One warpgroup: g before the wait for the kernel before this one, the slice's x g once x
    has come, then both tiles' sums over the slice's steps; then the epilogue."""
    _load_g(g_ptr, g_smem, K, k0, SLICE_CHUNKS, G_SPAN)
    _gdc_wait()
    if not LATE_DEPENDENTS:
        _gdc_launch_dependents()
    squares = _write_xg(xg_smem, g_smem, x_bar, SLICE_CHUNKS)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_X, 16]
    )
    za = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, acc_layout)
    zb = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, acc_layout)
    for j in range(n_steps):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        for c in gl.static_range(CHUNKS):
            i = 2 * (stage * CHUNKS + c)
            xg = xg_smem.index(j * CHUNKS + c).permute((1, 0))
            za = warpgroup_mma(w_smem.index(i), xg, za, is_async=True)
            zb = warpgroup_mma(w_smem.index(i + 1), xg, zb, is_async=True)
        za, zb = warpgroup_mma_wait(num_outstanding=0, deps=(za, zb))
        mbarrier.arrive(free.index(stage))
    if LATE_DEPENDENTS:
        _gdc_launch_dependents()

    # za[i, j], zb[i, j]: row m0 + j's sums for the tiles' i-th rows (a pair's two halves).
    out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1])
    za = gl.convert_layout(za, out_layout)
    zb = gl.convert_layout(zb, out_layout)
    squares = gl.convert_layout(squares, gl.SliceLayout(0, out_layout))
    lane = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
    rm = m0 + gl.arange(0, BLOCK_X, layout=gl.SliceLayout(0, out_layout))
    done = SPLITS == 1
    if SPLITS > 1:
        cell = gl.expand_dims(lane * BLOCK_X, 1) + gl.expand_dims(rm - m0, 0)
        parts = part_ptr + tile.to(gl.int64) * (SPLITS * 2 * TILE_CELLS) + cell
        sums = squares_ptr + tile.to(gl.int64) * (SPLITS * BLOCK_X) + (rm - m0)
        gl.store(parts + split * (2 * TILE_CELLS), za)
        gl.store(parts + split * (2 * TILE_CELLS) + TILE_CELLS, zb)
        gl.store(sums + split * BLOCK_X, squares)
        cta_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == SPLITS - 1
        if done:
            gl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            za = gl.load(parts)
            zb = gl.load(parts + TILE_CELLS)
            squares = gl.load(sums)
            for s in gl.static_range(1, SPLITS):
                za += gl.load(parts + s * (2 * TILE_CELLS))
                zb += gl.load(parts + s * (2 * TILE_CELLS) + TILE_CELLS)
                squares += gl.load(sums + s * BLOCK_X)
    if done:
        scale = gl.expand_dims(gl.rsqrt(squares / K + eps), 0)
        za, zb = za * scale, zb * scale
        m_ok = gl.expand_dims(rm < M, 0)
        if is_qk:
            # cos and sin (m, HALF) at the pairs' positions in the head
            trig = gl.expand_dims(rm.to(gl.int64) * HALF, 0) + gl.expand_dims(pair0 + lane, 1)
            c = gl.load(cos_ptr + trig, mask=m_ok, other=1.0)
            sn = gl.load(sin_ptr + trig, mask=m_ok, other=0.0)
            out = gl.expand_dims(rm.to(gl.int64) * N_QK, 0)
            # true for a head's rows: it gives the mask its shape
            ok = m_ok & gl.expand_dims(row_b + lane < N_QK, 1)
            rot_a = (za * c - zb * sn).to(qk_ptr.dtype.element_ty)
            rot_b = (zb * c + za * sn).to(qk_ptr.dtype.element_ty)
            gl.store(qk_ptr + out + gl.expand_dims(row_a + lane, 1), rot_a, mask=ok)
            gl.store(qk_ptr + out + gl.expand_dims(row_b + lane, 1), rot_b, mask=ok)
        else:
            out = gl.expand_dims(rm.to(gl.int64) * N_V, 0)
            ok_a = m_ok & gl.expand_dims(row_a + lane < N_V, 1)
            ok_b = m_ok & gl.expand_dims(row_b + lane < N_V, 1)
            gl.store(
                v_ptr + out + gl.expand_dims(row_a + lane, 1),
                za.to(v_ptr.dtype.element_ty),
                mask=ok_a,
            )
            gl.store(
                v_ptr + out + gl.expand_dims(row_b + lane, 1),
                zb.to(v_ptr.dtype.element_ty),
                mask=ok_b,
            )


@gluon.jit
def _rmsnorm_gemm_rope(wqk_desc, wv_desc, x_desc, g_ptr, cos_ptr, sin_ptr, qk_ptr, v_ptr,
                       part_ptr, squares_ptr, count_ptr, M, K, N_QK, N_V, pair_programs, eps,
                       HALF: gl.constexpr, BLOCK_K: gl.constexpr, STEPS: gl.constexpr,
                       G_SPAN: gl.constexpr,
                       STAGES: gl.constexpr, SPLITS: gl.constexpr,
                       LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    pid_n, pid_s, pid_m = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    m0 = pid_m * BLOCK_X
    tile = pid_m * gl.num_programs(0) + pid_n
    CHUNKS: gl.constexpr = BLOCK_K // 64
    SLICE_CHUNKS: gl.constexpr = BLOCK_K // 64 * STEPS
    first = pid_s * STEPS
    n_steps = gl.minimum(STEPS, gl.cdiv(K, BLOCK_K) - first)
    k0 = first * BLOCK_K
    is_qk = pid_n < pair_programs
    # A q/k program: 64 pairs (j, j + HALF) of one head; a v program: two tiles of 64 rows.
    pair = pid_n * BLOCK_W
    pair0 = pair % HALF
    row_a = gl.where(is_qk, (pair // HALF) * (2 * HALF) + pair0, (pid_n - pair_programs) * 128)
    row_b = row_a + gl.where(is_qk, HALF, BLOCK_W)

    dtype: gl.constexpr = wqk_desc.dtype
    w_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS * 2, BLOCK_W, 64], wqk_desc.layout)
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
            (_products, (w_smem, xg_smem, g_smem, x_bar, ready, free, n_steps, g_ptr, cos_ptr,
                         sin_ptr, qk_ptr, v_ptr, part_ptr, squares_ptr, count_ptr, M, K, N_QK,
                         N_V, k0, m0, is_qk, row_a, row_b, pair0, tile, pid_s, eps, HALF, CHUNKS,
                         STAGES, SLICE_CHUNKS, G_SPAN, SPLITS, LATE_DEPENDENTS)),
            (_loader, (wqk_desc, wv_desc, x_desc, w_smem, xg_smem, ready, free, x_bar, is_qk,
                       row_a, row_b, m0, k0, n_steps, SLICE_CHUNKS, CHUNKS, STAGES)),
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


def _refusal(x, g, w_qk, w_v, cos, sin, block_k: int, split_k: int, stages: int, programs: int):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    tensors = (x, g, w_qk, w_v)
    if x.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != x.dtype for t in tensors):
        return f"needs bf16 or fp16 x, g and weights of one dtype; got {[t.dtype for t in tensors]}"
    half = cos.shape[1]
    if half % ROWS_W:
        return f"head_dim {2 * half}: head_dim / 2 a multiple of {ROWS_W} only"
    if w_qk.shape[0] == 0:
        return "needs q/k rows (w_qk has none)"
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
    if any(t.data_ptr() % 16 for t in (x, w_qk, w_v)):
        return "needs 16-byte aligned x and weights (TMA)"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {x.device}"
    if any(t.device != x.device for t in (*tensors, cos, sin)):
        return f"inputs on {[str(t.device) for t in (*tensors, cos, sin)]}: one device only"
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
    w_qk: torch.Tensor,
    w_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    block_k: int = 64,
    split_k: int = 4,
    num_stages: int = 4,
    late_dependents: bool = False,
    programs_per_sm: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    half = cos.shape[1]
    n_qk, n_v = w_qk.shape[0], w_v.shape[0]
    if w_qk.shape[1] != k or w_v.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w_qk and w_v must be (n, {k}) and g ({k},), got {tuple(w_qk.shape)}, "
            f"{tuple(w_v.shape)}, {tuple(g.shape)}"
        )
    if cos.shape != (m, half) or sin.shape != (m, half) or half == 0 or n_qk % (2 * half):
        raise ValueError(
            f"cos and sin must be ({m}, d/2) with w_qk's rows a multiple of d, got "
            f"{tuple(cos.shape)}, {tuple(sin.shape)}, {n_qk} rows"
        )
    if k == 0:
        raise ValueError("x must have at least one column: the norm of an empty row is undefined")
    x, g, w_qk, w_v = x.contiguous(), g.contiguous(), w_qk.contiguous(), w_v.contiguous()
    cos, sin = cos.contiguous().float(), sin.contiguous().float()
    why = _refusal(x, g, w_qk, w_v, cos, sin, block_k, split_k, num_stages, programs_per_sm)
    if why is not None:
        raise ValueError(f"gluon RMSNorm + qkv + rope {why}; use triton_rmsnorm_gemm_rope.py")
    qk = torch.empty((m, n_qk), device=x.device, dtype=x.dtype)
    v = torch.empty((m, n_v), device=x.device, dtype=x.dtype)
    if m == 0:
        return qk, v
    steps, splits = slice_steps(k, block_k, split_k)
    pair_programs = n_qk // 2 // ROWS_W
    grid = (pair_programs + triton.cdiv(n_v, 2 * ROWS_W), splits, triton.cdiv(m, ROWS_X))
    tiles = grid[0] * grid[2]
    if splits > 1:
        parts = torch.empty(tiles * splits * 2 * TILE, device=x.device, dtype=torch.float32)
        squares = torch.empty(tiles * splits * ROWS_X, device=x.device, dtype=torch.float32)
        counts = _arrival_counts(tiles, x.device)
    else:
        parts = squares = counts = qk  # not read
    w_v_desc = _descriptor(w_v) if n_v else _descriptor(w_qk)  # no v programs without rows
    with torch.cuda.device(x.device):
        _rmsnorm_gemm_rope[grid](
            _descriptor(w_qk), w_v_desc, _descriptor(x, ROWS_X), g, cos, sin, qk, v, parts,
            squares, counts, m, k, n_qk, n_v, pair_programs, EPS, HALF=half, BLOCK_K=block_k,
            STEPS=steps, G_SPAN=triton.next_power_of_2(steps * block_k), STAGES=num_stages,
            SPLITS=splits, LATE_DEPENDENTS=bool(late_dependents), num_warps=4, launch_pdl=True,
            maxnreg=REGISTER_CAPS[programs_per_sm],
        )  # fmt: skip
    return qk, v

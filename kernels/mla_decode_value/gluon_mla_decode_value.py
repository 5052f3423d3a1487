"""MLA decode and its value projection for Hopper (sm_90): gluon_mla_decode.py's split kernel
(flash-decoding over the latent cache: a program takes 64 heads of one sequence over one split;
two warpgroups, each owning half the output's 512 columns and computing every other tile's
scores, sharing the probabilities through shared memory, and a TMA loader warp), then one
Triton kernel that merges a head's splits by their log-sum-exp and multiplies the merged row,
rounded to the input dtype as the unfused ops hand it on, by that head's W_UV. The merge's
partials stay in L2 between the two kernels, and the 16 MiB weight streams in the same kernel,
so the value projection's launch, ramp and tail are gone. A program takes `block_m` sequences
of one head (tensor cores from 16), `block_k` latent columns a step, software-pipelined
`merge_stages` deep; its first W_UV tile, which nothing earlier writes, is loaded before its
griddepcontrol.wait. At a few sequences a head's merge is one program's long serial read; with
`column_slices` above 1 the head's 512 columns are cut among that many programs, each storing
its product in fp32, and the last to arrive adds them up. Their arrival counts live in one
buffer per device, so calls on one device must not overlap (one stream, as torch runs them).

Both kernels are launched with programmatic dependent launch: each partition of the split kernel
waits for the kernel before it before touching global memory, and its loader then lets the
merge launch, which waits in turn. Runs on sm_90 with bf16 or fp16 contiguous inputs, heads a
multiple of 64, rank 512, rope 64, v_head_dim 128 and a cache length a multiple of the tile;
anything else is a ValueError naming what. Gluon has no interpreter: the CPU
tests build the split kernel for sm_90 and run the merge under the interpreter; the GPU tests
check the outputs."""

import math

import torch
import triton
import triton.language as tl
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
from triton.runtime.errors import OutOfResources

LANGUAGE = "triton"
PARAMS = {
    "block_n": [32, 64],
    "num_stages": [2, 3, 4],
    "block_m": [1, 16],
    "block_k": [32, 64, 128],
    "merge_warps": [4, 8],
    "merge_stages": [1, 2, 3, 4],
    "column_slices": [1, 2, 4, 8],
}

LOG2E = 1.4426950408889634
SCALE_DIM = 192
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
RANK = 512
ROPE = 64
HEADS = 64  # a program's heads: one wgmma is 64 rows tall
CHUNK = gl.constexpr(64)  # columns of a shared-memory chunk (a 128-byte swizzled row)
CHUNKS = gl.constexpr((RANK + ROPE) // 64)  # latent chunks 0-7, the rope chunk 8
HALF_CHUNKS = gl.constexpr(RANK // 64 // 2)  # the latent chunks of a warpgroup's output half
MAX_SPLITS = 128  # the splits a merge program reads in one step
V_DIM = 128
ROWS = gl.constexpr(HEADS)
OUT_COLS = gl.constexpr(RANK)


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait: the kernel before this one has finished and its writes are seen."""
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _loader(qn_desc, qp_desc, c_desc, p_desc, q_smem, kv_smem, bars, q_row, kv_row, n_tiles,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: the queries once, then each cache tile by TMA into the ring, a buffer as soon as
    both warpgroups have released it (a fresh barrier passes the first wait, parity 1)."""
    q_bar, ready, free, _ = bars
    _gdc_wait()
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )
    mbarrier.expect(q_bar, CHUNKS * qn_desc.block_type.nbytes)
    for c in gl.static_range(CHUNKS - 1):
        tma_load(qn_desc, [q_row, c * CHUNK], q_bar, q_smem.index(c))
    tma_load(qp_desc, [q_row, 0], q_bar, q_smem.index(CHUNKS - 1))
    for j in range(n_tiles):
        stage = j % STAGES
        row = kv_row + j * BLOCK_N
        mbarrier.wait(free.index(stage), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), CHUNKS * c_desc.block_type.nbytes)
        for c in gl.static_range(CHUNKS - 1):
            tma_load(
                c_desc, [row, c * CHUNK], ready.index(stage), kv_smem.index(stage * CHUNKS + c)
            )
        tma_load(p_desc, [row, 0], ready.index(stage), kv_smem.index(stage * CHUNKS + CHUNKS - 1))


@gluon.jit
def _scores(q_smem, kv_smem, stage, s_zero):
    """S = Q K^T over the 9 chunks of a buffer, issued as chained products (not waited)."""
    base = stage * CHUNKS
    s = warpgroup_mma(q_smem.index(0), kv_smem.index(base).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)  # fmt: skip
    for c in gl.static_range(1, CHUNKS):
        s = warpgroup_mma(q_smem.index(c), kv_smem.index(base + c).permute((1, 0)), s,
                          is_async=True)  # fmt: skip
    return s


@gluon.jit
def _values(p, kv_smem, stage, o0, o1, o2, o3, W: gl.constexpr):
    """O_half += P V_half: warpgroup W's four 64-column latent chunks of a buffer (not waited)."""
    base = stage * CHUNKS + W * HALF_CHUNKS
    o0 = warpgroup_mma(p, kv_smem.index(base), o0, is_async=True)
    o1 = warpgroup_mma(p, kv_smem.index(base + 1), o1, is_async=True)
    o2 = warpgroup_mma(p, kv_smem.index(base + 2), o2, is_async=True)
    o3 = warpgroup_mma(p, kv_smem.index(base + 3), o3, is_async=True)
    return o0, o1, o2, o3


@gluon.jit
def _scaled(o0, o1, o2, o3, alpha):
    """The four output chunks, each row times alpha."""
    a = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o0.type.layout)), 1)
    return o0 * a, o1 * a, o2 * a, o3 * a


@gluon.jit
def _store(o, inv_l, po_ptr, rows, col0):
    """One 64-column chunk of a program's partial output, normalised."""
    layout: gl.constexpr = o.type.layout
    c = col0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
    r = gl.convert_layout(rows, gl.SliceLayout(1, layout))
    il = gl.convert_layout(inv_l, gl.SliceLayout(1, layout))
    ptrs = po_ptr + gl.expand_dims(r * OUT_COLS, 1) + gl.expand_dims(c, 0)
    gl.store(ptrs, o * gl.expand_dims(il, 1))


@gluon.jit
def _probabilities(kv_smem, stage, BLOCK_N: gl.constexpr):
    """A buffer's rope chunk, which only its tile's scores read, as that tile's probabilities
    (64 heads x BLOCK_N keys in the same bytes; at 32-key tiles the chunk transposed, the
    probabilities then stored heads fastest, which wgmma reads as well)."""
    chunk = kv_smem.index(stage * CHUNKS + CHUNKS - 1)
    if BLOCK_N == ROWS:
        return chunk
    else:
        return chunk.permute((1, 0))


@gluon.jit
def _take(kv_smem, stats, ready, p_ready, j, o0, o1, o2, o3, m_i, l_i, row_layout: gl.constexpr,
          W: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Tile j, whose scores the other warpgroup computed: its published row maxima and sums
    rescale this warpgroup's output half and row sums, and P_j V_j,half is issued with P_j from
    shared memory (not waited)."""
    stage = j % STAGES
    mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
    mbarrier.wait(p_ready.index(stage), (j // STAGES) & 1)
    m_new = stats.index(2 * stage).load(row_layout)
    row_sum = stats.index(2 * stage + 1).load(row_layout)
    alpha = gl.exp2(m_i - m_new)
    o0, o1, o2, o3 = _scaled(o0, o1, o2, o3, alpha)
    p = _probabilities(kv_smem, stage, BLOCK_N)
    o0, o1, o2, o3 = _values(p, kv_smem, stage, o0, o1, o2, o3, W)
    return o0, o1, o2, o3, m_new, l_i * alpha + row_sum


@gluon.jit
def _consumer_shared(q_smem, kv_smem, stats, bars, po_ptr, plse_ptr, q_row, n_splits, n_tiles,
                     scale_log2, W: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr):  # fmt: skip
    """One warpgroup, for output columns 256 W .. 256 W + 255, computing the scores of every
    other tile only (those with j % 2 == W, flash MLA's split of the work): it publishes a
    tile's probabilities (over the tile's rope chunk, which only the scores read) and its row
    maxima and sums, and takes the other warpgroup's. So the tiles' scores are computed once,
    and the running maximum passes from one warpgroup to the other tile by tile."""
    q_bar, ready, free, p_ready = bars
    _gdc_wait()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CHUNK, 16]
    )
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([ROWS], gl.float32, row_layout)
    o0 = gl.zeros([ROWS, CHUNK], gl.float32, o_layout)
    o1 = o0
    o2 = o0
    o3 = o0

    mbarrier.wait(q_bar, 0)
    own = (n_tiles - W + 1) // 2  # tiles W, W + 2, ...
    for i in range(own):
        j = W + 2 * i
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        s_acc = _scores(q_smem, kv_smem, stage, s_zero)
        if j > 0:  # the other warpgroup's tile j - 1 first, its product beside S_j
            o0, o1, o2, o3, m_i, l_i = _take(kv_smem, stats, ready, p_ready, j - 1, o0, o1, o2,
                                             o3, m_i, l_i, row_layout, W, BLOCK_N, STAGES)  # fmt: skip
            s, o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, o0, o1, o2, o3))
            mbarrier.arrive(free.index((j - 1) % STAGES))
        else:
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc,))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
        p16 = gl.exp2(s * scale_log2 - gl.expand_dims(m_new, 1)).to(q_smem.dtype)
        alpha = gl.exp2(m_i - m_new)
        row_sum = gl.sum(p16.to(gl.float32), axis=1)  # of the probabilities the products use
        # Publish: the scores are done with this buffer's rope chunk.
        _probabilities(kv_smem, stage, BLOCK_N).store(p16)
        stats.index(2 * stage).store(m_new)
        stats.index(2 * stage + 1).store(row_sum)
        fence_async_shared()  # then Triton's partition barrier, then one thread arrives
        mbarrier.arrive(p_ready.index(stage))
        m_i = m_new
        l_i = l_i * alpha + row_sum
        o0, o1, o2, o3 = _scaled(o0, o1, o2, o3, alpha)
        p = _probabilities(kv_smem, stage, BLOCK_N)  # as the other warpgroup reads it
        o0, o1, o2, o3 = _values(p, kv_smem, stage, o0, o1, o2, o3, W)
        o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
        mbarrier.arrive(free.index(stage))
    last = W + 2 * own - 1  # the other warpgroup's tile after this one's last, if any
    if last < n_tiles:
        o0, o1, o2, o3, m_i, l_i = _take(kv_smem, stats, ready, p_ready, last, o0, o1, o2, o3,
                                         m_i, l_i, row_layout, W, BLOCK_N, STAGES)  # fmt: skip
        o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
        mbarrier.arrive(free.index(last % STAGES))
    _epilogue(o0, o1, o2, o3, m_i, l_i, po_ptr, plse_ptr, q_row, n_splits, row_layout, W)


@gluon.jit
def _epilogue(o0, o1, o2, o3, m_i, l_i, po_ptr, plse_ptr, q_row, n_splits,
              row_layout: gl.constexpr, W: gl.constexpr):  # fmt: skip
    """The warpgroup's half of the split's normalised output, and (warpgroup 0) the rows'
    log2-sum-exp."""
    heads = gl.arange(0, ROWS, layout=row_layout)
    rows = (q_row + heads).to(gl.int64) * n_splits  # partial outputs: (sequence, head, split)
    inv_l = 1.0 / l_i
    col0 = W * HALF_CHUNKS * CHUNK
    _store(o0, inv_l, po_ptr, rows, col0)
    _store(o1, inv_l, po_ptr, rows, col0 + CHUNK)
    _store(o2, inv_l, po_ptr, rows, col0 + 2 * CHUNK)
    _store(o3, inv_l, po_ptr, rows, col0 + 3 * CHUNK)
    if W == 0:
        gl.store(plse_ptr + rows, m_i + gl.log2(l_i))


@gluon.jit
def _split_kernel(qn_desc, qp_desc, c_desc, p_desc, po_ptr, plse_ptr, heads, kv_len,
                  tiles_per_split, scale_log2, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):  # fmt: skip
    head_blocks = heads // ROWS
    seq = gl.program_id(0) // head_blocks
    q_row = seq * heads + gl.program_id(0) % head_blocks * ROWS
    split = gl.program_id(1)
    n_splits = gl.num_programs(1)
    first = split * tiles_per_split
    n_tiles = gl.minimum(tiles_per_split, kv_len // BLOCK_N - first)
    kv_row = seq * kv_len + first * BLOCK_N

    dtype: gl.constexpr = qn_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [CHUNKS, ROWS, CHUNK], qn_desc.layout)
    kv_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_N, CHUNK], c_desc.layout)
    layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    # A tile's probabilities published (one arrival, from the warpgroup that computed them),
    # and its row maxima and sums: two rows of `stats` a buffer.
    p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)  # one arrival from each warpgroup
        mbarrier.init(p_ready.index(i), count=1)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, ROWS], stats_layout)
    fence_async_shared()
    cta_barrier()
    po_split = po_ptr + split * OUT_COLS
    plse_split = plse_ptr + split
    bars = (q_bar, ready, free, p_ready)
    gl.warp_specialize(
        [
            (_consumer_shared, (q_smem, kv_smem, stats, bars, po_split, plse_split, q_row,
                                n_splits, n_tiles, scale_log2, 0, BLOCK_N, STAGES)),
            (_consumer_shared, (q_smem, kv_smem, stats, bars, po_split, plse_split, q_row,
                                n_splits, n_tiles, scale_log2, 1, BLOCK_N, STAGES)),
            (_loader, (qn_desc, qp_desc, c_desc, p_desc, q_smem, kv_smem, bars, q_row,
                       kv_row, n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [240, 24],
    )  # fmt: skip


@triton.jit
def _project(acc, parts, ok, weights, w, USE_DOT: tl.constexpr):
    """acc plus one step of columns: the splits' partials at `parts` merged by `weights`,
    rounded to w's dtype, times the weight tile w (DV x BLOCK_K)."""
    p = tl.load(parts, mask=ok[:, :, None], other=0.0)
    o = tl.sum(weights[:, :, None] * p, axis=1).to(w.dtype)  # the merged latent columns
    if USE_DOT:
        return tl.dot(o, tl.trans(w), acc)
    return acc + tl.sum(o.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _merge_value_kernel(po_ptr, plse_ptr, w_ptr, y_ptr, sum_ptr, count_ptr, B, H, n_splits,
                        R: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
                        PDL: tl.constexpr, COLUMN_SLICES: tl.constexpr = 1,
                        STAGES: tl.constexpr = 3):  # fmt: skip
    """BLOCK_M sequences of one head: their splits' partial outputs (rows (sequence, head,
    split) of R fp32) weighted by the splits' log2-sum-exp, BLOCK_K columns a step, rounded to
    y's dtype, times the head's W_UV (DV x R); y is (sequence, head, DV). With COLUMN_SLICES
    above 1, a program takes one slice of the R columns and stores its product in sum_ptr; the
    last of a tile's slices to count itself in count_ptr adds them up and stores y."""
    head = tl.program_id(1)
    slice_cols: tl.constexpr = R // COLUMN_SLICES
    col0 = tl.program_id(2) * slice_cols
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < B
    rows = rm.to(tl.int64) * H + head  # (sequence, head) rows of y and of the partials
    dv = tl.arange(0, DV)
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + head.to(tl.int64) * DV * R + dv[:, None] * R + col0
    # The first weight tile, which nothing earlier in the stream writes, before the wait.
    w = tl.load(w_rows + kk[None, :], eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
    s = tl.arange(0, BLOCK_S)
    ok = m_ok[:, None] & (s[None, :] < n_splits)
    part = rows[:, None] * n_splits + s[None, :]  # (BLOCK_M, BLOCK_S) partial rows
    lse = tl.load(plse_ptr + part, mask=ok, other=float("-inf"))
    top = tl.max(lse, axis=1)
    top = tl.where(m_ok, top, 0.0)
    weights = tl.exp2(lse - top[:, None])
    weights = tl.where(m_ok[:, None], weights / tl.sum(weights, axis=1)[:, None], 0.0)
    parts = po_ptr + part[:, :, None] * R + col0 + kk[None, None, :]
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    acc = _project(acc, parts, ok, weights, w, USE_DOT)
    for k0 in tl.range(BLOCK_K, slice_cols, BLOCK_K, num_stages=STAGES):
        w = tl.load(w_rows + k0 + kk[None, :], eviction_policy="evict_first")
        acc = _project(acc, parts + k0, ok, weights, w, USE_DOT)
    done = COLUMN_SLICES == 1
    if COLUMN_SLICES > 1:
        tile = tl.program_id(0) * H + head
        cell = tl.arange(0, BLOCK_M)[:, None] * DV + dv[None, :]
        tile_sums = sum_ptr + tile.to(tl.int64) * (COLUMN_SLICES * BLOCK_M * DV) + cell
        tl.store(tile_sums + tl.program_id(2) * (BLOCK_M * DV), acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == COLUMN_SLICES - 1
        if done:
            tl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            acc = tl.load(tile_sums)
            for c in tl.static_range(1, COLUMN_SLICES):
                acc += tl.load(tile_sums + c * (BLOCK_M * DV))
    if done:
        out = y_ptr + rows[:, None] * DV + dv[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of `t` as a (rows of all but the last dim, last dim) matrix in rows x 64
    tiles."""
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    flat = t.view(-1, t.shape[-1])
    layout = gl.NVMMASharedLayout.get_default_for([rows, 64], dtype)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, 64], layout)


def shared_bytes(block_n: int, stages: int) -> int:
    """Shared memory of a split program: the queries, the ring of cache tiles, the tiles' row
    maxima and sums, barriers with room."""
    return 2 * (RANK + ROPE) * (HEADS + stages * block_n) + 2 * stages * HEADS * 4 + 1024


def split_tiles(programs: int, tiles: int, sms: int) -> int:
    """Tiles per split so that the programs run in one wave of one per SM, in at most
    MAX_SPLITS splits (at 132 SMs, one sequence of 2 head blocks over 1024 tiles: 16 tiles a
    split, 128 programs)."""
    return triton.cdiv(tiles, max(1, min(tiles, sms // programs, MAX_SPLITS)))


# The arrival counts of column slices, per device: zero between calls (the last slice of a
# tile resets its count). Every buffer is kept, as a CUDA graph may hold any of them.
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


def _refusal(q_nope, q_pe, ckv, kpe, w_uv, block_n: int, stages: int, block_m: int, block_k: int,
             column_slices: int):  # fmt: skip
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    tensors = (q_nope, q_pe, ckv, kpe, w_uv)
    if not all(t.dim() == 3 for t in tensors):
        return "needs 3-D q_nope, q_pe, ckv, kpe and w_uv"
    if q_nope.dtype not in (torch.bfloat16, torch.float16) or any(
        t.dtype != q_nope.dtype for t in tensors
    ):
        return f"needs bf16 or fp16 inputs of one dtype; got {[t.dtype for t in tensors]}"
    if not all(t.is_contiguous() for t in tensors):
        return "needs contiguous inputs"
    b, h, r = q_nope.shape
    kv_len = ckv.shape[1]
    if r != RANK or q_pe.shape != (b, h, ROPE) or ckv.shape != (b, kv_len, RANK):
        return f"rank {RANK} and rope {ROPE} only; got q_nope {tuple(q_nope.shape)}, q_pe " + (
            f"{tuple(q_pe.shape)}, ckv {tuple(ckv.shape)}"
        )
    if kpe.shape != (b, kv_len, ROPE):
        return f"kpe {tuple(kpe.shape)} does not match ckv {tuple(ckv.shape)}"
    if w_uv.shape != (h, V_DIM, RANK):
        return f"w_uv {tuple(w_uv.shape)}: ({h}, {V_DIM}, {RANK}) only"
    if h % HEADS:
        return f"heads {h}: a multiple of {HEADS} only"
    if kv_len == 0 or kv_len % block_n:
        return f"kv_len {kv_len}: a positive multiple of {block_n} only"
    if b * max(h, kv_len) >= 2**31:
        return f"batch {b} x {max(h, kv_len)} rows above TMA's 32-bit coordinates"
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if shared_bytes(block_n, stages) > SHARED_BYTES:
        return f"block_n {block_n} at {stages} stages needs {shared_bytes(block_n, stages)} bytes"
    if block_m not in (1, 16):
        return f"block_m {block_m}: 1 (CUDA cores) or 16 (tensor cores)"
    if block_k < (16 if block_m == 16 else 1) or block_k & (block_k - 1) or RANK % block_k:
        return f"block_k {block_k}: a power of two dividing {RANK}, 16 at least with block_m 16"
    if column_slices < 1 or RANK % (column_slices * block_k):
        return f"column_slices {column_slices}: {RANK} columns in slices of whole block_k steps"
    if any(t.data_ptr() % 16 for t in tensors):
        return "needs 16-byte aligned inputs (TMA)"
    if not q_nope.is_cuda or torch.cuda.get_device_capability(q_nope.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {q_nope.device}"
    if any(t.device != q_nope.device for t in tensors):
        return f"inputs on {[str(t.device) for t in tensors]}"
    return None


def kernel(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    w_uv: torch.Tensor,
    block_n: int = 32,
    num_stages: int = 4,
    block_m: int = 1,
    block_k: int = 64,
    merge_warps: int = 4,
    merge_stages: int = 3,
    column_slices: int = 1,
) -> torch.Tensor:
    why = _refusal(
        q_nope, q_pe, ckv, kpe, w_uv, block_n, num_stages, block_m, block_k, column_slices
    )
    if why is not None:
        raise ValueError(f"gluon MLA decode with W_UV {why}")
    b, h, r = q_nope.shape
    kv_len = ckv.shape[1]
    device = q_nope.device
    out = torch.empty((b, h, V_DIM), device=device, dtype=q_nope.dtype)
    if b * h == 0:
        return out
    programs = b * h // HEADS
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = split_tiles(programs, kv_len // block_n, sms)
    n_splits = triton.cdiv(kv_len // block_n, tiles)
    block_s = max(2, triton.next_power_of_2(n_splits))
    descs = [
        _descriptor(t, rows)
        for t, rows in ((q_nope, HEADS), (q_pe, HEADS), (ckv, block_n), (kpe, block_n))
    ]
    part_o = torch.empty((b * h * n_splits, r), device=device, dtype=torch.float32)
    part_lse = torch.empty((b * h * n_splits,), device=device, dtype=torch.float32)
    tiles_m = triton.cdiv(b, block_m)
    sums = counts = None
    if column_slices > 1:
        sums = torch.empty(
            tiles_m * h * column_slices * block_m * V_DIM, device=device, dtype=torch.float32
        )
        counts = _arrival_counts(tiles_m * h, device)
    with torch.cuda.device(device):
        _split_kernel[(programs, n_splits)](
            *descs, part_o, part_lse, h, kv_len, tiles, LOG2E / math.sqrt(SCALE_DIM),
            BLOCK_N=block_n, STAGES=num_stages, num_warps=4, launch_pdl=True,
        )  # fmt: skip
        try:
            _merge_value_kernel[(tiles_m, h, column_slices)](
                part_o, part_lse, w_uv, out, sums, counts, b, h, n_splits, R=r, DV=V_DIM,
                BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_K=block_k,
                USE_DOT=block_m >= 16, PDL=True, COLUMN_SLICES=column_slices, STAGES=merge_stages,
                num_warps=merge_warps, launch_pdl=True,
            )  # fmt: skip
        except OutOfResources as exc:  # e.g. the pipelined tiles of partials outgrow an SM
            smaller = ["a smaller block_k", "fewer merge_stages"]
            if block_m > 1:
                smaller.insert(0, "block_m 1")
            raise ValueError(
                f"gluon MLA decode with W_UV: the merge at block_m {block_m} over {n_splits} "
                f"splits in {block_k}-column steps, {merge_stages} stages deep, "
                f"{merge_warps} warps, does not fit ({exc}); try {' or '.join(smaller)}"
            ) from exc
    return out

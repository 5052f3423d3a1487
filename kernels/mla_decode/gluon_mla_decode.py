"""MLA decode in Gluon for Hopper (sm_90), flash-decoding style with flash attention 3's
ping-pong, which Triton's compiler cannot schedule: the latent cache is cut into splits along its
length, and a program takes 64 heads of one sequence over one split. It is two warpgroups and
one loader warp (warp specialization, each with its own register budget). The loader brings the
queries once and each cache tile (512 latent and 64 rope columns, in 64-column chunks) by TMA
into a ring of `num_stages` buffers. The output's 512 columns are too many for one warpgroup's
registers (a 64 x 512 fp32 accumulator), so each warpgroup owns half of them: both compute the
tile's scores and softmax (the same values), then each multiplies the probabilities by its half
of the latent tile. The warpgroups take turns at the tensor cores (an mbarrier pair passes the
turn), so one's softmax runs under the other's products. A Triton kernel then merges the splits
by their log-sum-exp. Both kernels are launched with programmatic dependent launch: each
partition of the split kernel waits (griddepcontrol.wait) for the kernel before it, before
touching global memory, and the loader then lets the merge launch, which waits in turn, so the
merge's launch passes while the split kernel runs. The merge does not let the kernel after it
launch early, as head_gemv does not: an early dependent competes with the merge's later waves
(session 19 measured no clear difference either way).

Runs on sm_90 with bf16 or fp16 contiguous inputs, heads a multiple of 64, rank 512, rope 64 and
a cache length a multiple of the tile; anything else is a ValueError naming what (the Triton
candidate takes it). Gluon has no interpreter: the CPU tests build it for sm_90, and the GPU
tests check its outputs."""

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

LANGUAGE = "triton"
PARAMS = {
    "block_n": [32, 64],
    "num_stages": [2, 3, 4],
    "eager_values": [False, True],
    "shared_p": [False, True],
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
MERGE_SPLITS = 64  # at most, the splits the merge reads a step
MERGE_COLUMNS = 128  # the columns of a merge program
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
def _softmax(s, m_i, l_i, scale_log2):
    """Probabilities of one score tile (log2 units, scale folded in), the new row maxima, the
    factor that rescales what came before, and the new row sums."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
    p = gl.exp2(s * scale_log2 - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    return p, m_new, alpha, l_i * alpha + gl.sum(p, axis=1)


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
def _consumer(q_smem, kv_smem, bars, po_ptr, plse_ptr, q_row, n_splits, n_tiles, scale_log2,
              W: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              EAGER_VALUES: gl.constexpr):  # fmt: skip
    """One warpgroup: the program's 64 heads over every tile of its split, for output columns
    256 W .. 256 W + 255; the two warpgroups take turns at the tensor cores, so one's softmax
    runs under the other's products (flash attention 3's ping-pong)."""
    q_bar, ready, free, turn = bars
    _gdc_wait()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CHUNK, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)

    # Tile 0: its scores and softmax.
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    mbarrier.wait(turn.index(W), 0)
    s = _scores(q_smem, kv_smem, 0, s_zero)
    mbarrier.arrive(turn.index(1 - W))
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    m_i = gl.max(s, axis=1) * scale_log2
    p = gl.exp2(s * scale_log2 - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, axis=1)
    p = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    o0 = gl.zeros([ROWS, CHUNK], gl.float32, o_layout)
    o1 = o0
    o2 = o0
    o3 = o0

    if EAGER_VALUES:
        # Each tile's P V issued straight after its softmax (tile 0's at once), so its buffer
        # goes back to the loader a tile sooner; S_j alone in this warpgroup's turn.
        o0, o1, o2, o3 = _values(p, kv_smem, 0, o0, o1, o2, o3, W)
        o0, o1, o2, o3, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3, p))
        mbarrier.arrive(free.index(0))
        for j in range(1, n_tiles):
            stage = j % STAGES
            mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
            mbarrier.wait(turn.index(W), j & 1)
            s = _scores(q_smem, kv_smem, stage, s_zero)
            mbarrier.arrive(turn.index(1 - W))
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            p_new, m_i, alpha, l_i = _softmax(s, m_i, l_i, scale_log2)
            o0, o1, o2, o3 = _scaled(o0, o1, o2, o3, alpha)
            p = gl.convert_layout(p_new.to(q_smem.dtype), p_layout)
            o0, o1, o2, o3 = _values(p, kv_smem, stage, o0, o1, o2, o3, W)
            o0, o1, o2, o3, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3, p))
            mbarrier.arrive(free.index(stage))
    else:
        # Tile j: S_j and P_{j-1} V_{j-1} issued in this warpgroup's turn, then the softmax of
        # S_j.
        for j in range(1, n_tiles):
            stage = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
            mbarrier.wait(turn.index(W), j & 1)
            s = _scores(q_smem, kv_smem, stage, s_zero)
            o0, o1, o2, o3 = _values(p, kv_smem, prev, o0, o1, o2, o3, W)
            mbarrier.arrive(turn.index(1 - W))
            # Groups finish in order: four left in flight means S_j is done.
            s = warpgroup_mma_wait(num_outstanding=4, deps=(s,))
            p_new, m_i, alpha, l_i = _softmax(s, m_i, l_i, scale_log2)
            o0, o1, o2, o3, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3, p))
            mbarrier.arrive(free.index(prev))
            o0, o1, o2, o3 = _scaled(o0, o1, o2, o3, alpha)
            p = gl.convert_layout(p_new.to(q_smem.dtype), p_layout)
        last = (n_tiles - 1) % STAGES
        o0, o1, o2, o3 = _values(p, kv_smem, last, o0, o1, o2, o3, W)
        o0, o1, o2, o3, p = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3, p))
        mbarrier.arrive(free.index(last))

    _epilogue(
        o0, o1, o2, o3, m_i, l_i, po_ptr, plse_ptr, q_row, n_splits, gl.SliceLayout(1, s_layout), W
    )


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
                  tiles_per_split, scale_log2, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  EAGER_VALUES: gl.constexpr, SHARED_P: gl.constexpr):  # fmt: skip
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
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=2)  # one arrival from each warpgroup
    po_split = po_ptr + split * OUT_COLS
    plse_split = plse_ptr + split
    if SHARED_P:
        # A tile's probabilities published (one arrival, from the warpgroup that computed
        # them), and its row maxima and sums: two rows of `stats` a buffer.
        p_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
        for i in gl.static_range(STAGES):
            mbarrier.init(p_ready.index(i), count=1)
        stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        stats = gl.allocate_shared_memory(gl.float32, [2 * STAGES, ROWS], stats_layout)
        fence_async_shared()
        cta_barrier()
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
    else:
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], layout)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        mbarrier.arrive(turn.index(0))  # warpgroup 0 goes first
        fence_async_shared()
        cta_barrier()
        bars = (q_bar, ready, free, turn)
        gl.warp_specialize(
            [
                (_consumer, (q_smem, kv_smem, bars, po_split, plse_split, q_row, n_splits,
                             n_tiles, scale_log2, 0, BLOCK_N, STAGES, EAGER_VALUES)),
                (_consumer, (q_smem, kv_smem, bars, po_split, plse_split, q_row, n_splits,
                             n_tiles, scale_log2, 1, BLOCK_N, STAGES, EAGER_VALUES)),
                (_loader, (qn_desc, qp_desc, c_desc, p_desc, q_smem, kv_smem, bars, q_row,
                           kv_row, n_tiles, BLOCK_N, STAGES)),
            ],
            [4, 1],
            [240, 24],
        )  # fmt: skip


@triton.jit
def _merge_kernel(po_ptr, plse_ptr, out_ptr, n_splits, R: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_S: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """BLOCK_R columns of one (sequence, head): the splits' partial outputs weighted by their
    log-sum-exp, read BLOCK_S splits a step with a running maximum (one pass over the
    partials; at batch 1 one step, the columns spread over four programs a head)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    rr = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    m = tl.max(tl.full((BLOCK_S,), float("-inf"), dtype=tl.float32), axis=0)
    den = tl.sum(tl.zeros((BLOCK_S,), dtype=tl.float32), axis=0)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        ok = offs < n_splits
        lse = tl.load(plse_ptr + row * n_splits + offs, mask=ok, other=float("-inf"))
        o = tl.load(
            po_ptr + (row * n_splits + offs)[:, None] * R + rr[None, :], mask=ok[:, None], other=0.0
        )
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        keep = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * keep + tl.sum(w[:, None] * o, axis=0)
        den = den * keep + tl.sum(w, axis=0)
        m = m_new
    tl.store(out_ptr + row * R + rr, (acc / den).to(out_ptr.dtype.element_ty))


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of `t` as a (rows of all but the last dim, last dim) matrix in rows x 64
    tiles."""
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    flat = t.view(-1, t.shape[-1])
    layout = gl.NVMMASharedLayout.get_default_for([rows, 64], dtype)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, 64], layout)


def shared_bytes(block_n: int, stages: int, shared_p: bool = False) -> int:
    """Shared memory of a program: the queries, the ring of cache tiles, (shared_p) the tiles'
    row maxima and sums, barriers with room."""
    stats = 2 * stages * HEADS * 4 if shared_p else 0
    return 2 * (RANK + ROPE) * (HEADS + stages * block_n) + stats + 1024


def _refusal(q_nope, q_pe, ckv, kpe, block_n: int, stages: int, shared_p: bool):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    tensors = (q_nope, q_pe, ckv, kpe)
    if not all(t.dim() == 3 for t in tensors):
        return "needs 3-D q_nope, q_pe, ckv and kpe"
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
    if h % HEADS:
        return f"heads {h}: a multiple of {HEADS} only"
    if kv_len == 0 or kv_len % block_n:
        return f"kv_len {kv_len}: a positive multiple of {block_n} only"
    if b * max(h, kv_len) >= 2**31:
        return f"batch {b} x {max(h, kv_len)} rows above TMA's 32-bit coordinates"
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if shared_bytes(block_n, stages, shared_p) > SHARED_BYTES:
        need = shared_bytes(block_n, stages, shared_p)
        return f"block_n {block_n} at {stages} stages needs {need} bytes"
    if any(t.data_ptr() % 16 for t in tensors):
        return "needs 16-byte aligned inputs (TMA)"
    if not q_nope.is_cuda or torch.cuda.get_device_capability(q_nope.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {q_nope.device}"
    if any(t.device != q_nope.device for t in tensors):
        return f"inputs on {[str(t.device) for t in tensors]}"
    return None


def split_tiles(programs: int, tiles: int, sms: int) -> int:
    """Tiles per split so that the programs run in one wave of one per SM (at 132 SMs, one
    sequence of 2 head blocks over 512 tiles: 8 tiles a split, 128 programs)."""
    return triton.cdiv(tiles, max(1, min(tiles, sms // programs)))


def merge_shape(rows: int, n_splits: int, sms: int) -> tuple[int, int]:
    """The merge's columns a program and splits a step. Where a program a (sequence, head) row
    leaves SMs idle (batch 1), a row's 512 columns spread over four programs, which read up to
    64 splits a step (one step at 32k); else one program a row, 16 splits a step, so as not to
    launch four times the programs for the same bytes."""
    if rows < sms:
        return MERGE_COLUMNS, min(MERGE_SPLITS, triton.next_power_of_2(n_splits))
    return RANK, min(MERGE_SPLITS * MERGE_COLUMNS // RANK, triton.next_power_of_2(n_splits))


def kernel(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    block_n: int = 64,
    num_stages: int = 2,
    eager_values: bool = False,
    shared_p: bool = False,
) -> torch.Tensor:
    if shared_p and eager_values:
        raise ValueError(
            "gluon MLA decode: shared_p issues each tile's values as soon as its probabilities "
            "exist; eager_values is for the two-warpgroup order without it"
        )
    why = _refusal(q_nope, q_pe, ckv, kpe, block_n, num_stages, shared_p)
    if why is not None:
        raise ValueError(f"gluon MLA decode {why}; use triton_mla_decode.py")
    b, h, r = q_nope.shape
    kv_len = ckv.shape[1]
    device = q_nope.device
    out = torch.empty((b, h, r), device=device, dtype=q_nope.dtype)
    if b * h == 0:
        return out
    programs = b * h // HEADS
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = split_tiles(programs, kv_len // block_n, sms)
    n_splits = triton.cdiv(kv_len // block_n, tiles)
    descs = [
        _descriptor(t, rows)
        for t, rows in ((q_nope, HEADS), (q_pe, HEADS), (ckv, block_n), (kpe, block_n))
    ]
    part_o = torch.empty((b * h * n_splits, r), device=device, dtype=torch.float32)
    part_lse = torch.empty((b * h * n_splits,), device=device, dtype=torch.float32)
    columns, splits_a_step = merge_shape(b * h, n_splits, sms)
    with torch.cuda.device(device):
        _split_kernel[(programs, n_splits)](
            *descs, part_o, part_lse, h, kv_len, tiles, LOG2E / math.sqrt(SCALE_DIM),
            BLOCK_N=block_n, STAGES=num_stages, EAGER_VALUES=bool(eager_values),
            SHARED_P=bool(shared_p), num_warps=4, launch_pdl=True,
        )  # fmt: skip
        _merge_kernel[(b * h, r // columns)](
            part_o, part_lse, out, n_splits, R=r, BLOCK_R=columns, BLOCK_S=splits_a_step,
            PDL=True, num_warps=4, launch_pdl=True,
        )  # fmt: skip
    return out

"""Causal prefill attention in Gluon for Hopper (sm_90), scheduled as flash attention 3 does
it, which Triton's compiler cannot: a program of 128 query rows of one head is split into two
warpgroups of 64 rows and one loader warp (warp specialization, each with its own register
budget). The warpgroups take turns at the tensor cores (an mbarrier pair passes the turn), so
one's softmax runs while the other's products do; the loader brings Q once and each key tile's
K and V by TMA into a ring of `num_stages` buffers, refilling a buffer once both warpgroups
have released it.

Per key tile j a warpgroup issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} in its turn, waits for
S_j, runs its softmax (exp2, scale folded in; masked only on the tiles that cross the
diagonal), then waits for the product and rescales O. ptxas (Triton 3.6's and 3.9's) moves
that wait above the softmax whatever the PTX says, so the overlap is the other warpgroup's
(scripts/prefill_sm90_schedule.py). Issuing each next tile's Q K^T before the softmax keeps a
product in flight over it in the PTX, but the in-flight scores then cross the loop's back edge,
and ptxas serialises every wgmma (tried and dropped). `pairs` takes the unmasked tiles two an
iteration instead: the second's Q K^T is issued with the first's products and stays in flight
over the first's softmax, and nothing in flight crosses the loop's edge (64-key tiles only: at
128 it spills and is serialised). Heaviest query blocks first; bottom-right aligned mask.

Runs on sm_90 with bf16 or fp16 inputs whose lengths are multiples of the tiles and whose
(batch, heads, length, head_dim) layout is contiguous; anything else is a ValueError naming
what (the Triton candidate takes it). Gluon has no interpreter: the CPU tests build it for
sm_90, and the GPU tests check its outputs."""

import math

import torch
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
    "block_n": [64, 128],
    "num_stages": [2, 3, 4],
    "pairs": [False, True],
}

LOG2E = 1.4426950408889634
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
BLOCK_M = 128  # query rows of a program: two warpgroups of 64 (a wgmma is 64 rows tall)
HALF = gl.constexpr(BLOCK_M // 2)
FIRST_WARPGROUP = gl.constexpr(0)
SECOND_WARPGROUP = gl.constexpr(1)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, q_row, kv_row, n_tiles,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: Q once, then each key tile's K and V by TMA into the ring, a buffer as soon as
    both warpgroups have released it (a fresh barrier passes the first wait, parity 1)."""
    q_bar, k_ready, v_ready, k_free, v_free, _ = bars
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for j in range(n_tiles):
        stage = j % STAGES
        phase = ((j // STAGES) & 1) ^ 1
        row = kv_row + j * BLOCK_N
        mbarrier.wait(k_free.index(stage), phase)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma_load(k_desc, [row, 0], k_ready.index(stage), k_smem.index(stage))
        mbarrier.wait(v_free.index(stage), phase)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma_load(v_desc, [row, 0], v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _softmax(s, m_i, l_i, rows, n0, offset, scale_log2, FIRST: gl.constexpr, MASK: gl.constexpr):
    """Probabilities of one score tile (log2 units, scale folded in), the new row maxima, the
    factor that rescales what came before, and the new row sums; masked past each query's
    diagonal where MASK."""
    if MASK:
        cols = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        visible = gl.expand_dims(cols, 0) <= gl.expand_dims(rows + offset, 1)
        s = gl.where(visible, s * scale_log2, float("-inf"))
        row_max = gl.max(s, axis=1)
        mul = 1.0
    else:
        # The scale multiplies the row maxima only; the tile takes one fused multiply-add.
        row_max = gl.max(s, axis=1) * scale_log2
        mul = scale_log2
    m_new = row_max if FIRST else gl.maximum(m_i, row_max)
    p = gl.exp2(s * mul - gl.expand_dims(m_new, 1))
    if FIRST:
        alpha = gl.full_like(m_new, 1.0)
        l_new = gl.sum(p, axis=1)
    else:
        alpha = gl.exp2(m_i - m_new)
        l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, alpha, l_new


@gluon.jit
def _rescaled(acc, p, p_new, alpha, v_free, prev, OUTSTANDING: gl.constexpr):
    """After a softmax: the wait for O += P_{j-1} V_{j-1} (OUTSTANDING later groups left in
    flight; P_{j-1} a dependency, its registers the product's operand until then), V_{j-1}'s
    buffer released, O rescaled, and the new P in the product's operand layout."""
    acc, p = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=(acc, p))
    mbarrier.arrive(v_free.index(prev))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
    return acc, gl.convert_layout(p_new.to(p.dtype), p.type.layout)


@gluon.jit
def _tile(q, k_smem, v_smem, bars, acc, m_i, l_i, p, j, rows, offset, scale_log2, s_zero,
          W: gl.constexpr, STAGES: gl.constexpr, MASK: gl.constexpr):  # fmt: skip
    """Key tile j >= 1 of warpgroup W: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued in this
    warpgroup's turn, then the softmax of S_j. The PTX leaves the product in flight over the
    softmax; ptxas (Triton 3.6's and 3.9's) waits for it first all the same
    (scripts/prefill_sm90_schedule.py), so the overlap is the other warpgroup's."""
    _, k_ready, v_ready, k_free, v_free, turn = bars
    stage = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_ready.index(stage), (j // STAGES) & 1)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
    mbarrier.wait(turn.index(W), j & 1)
    s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)  # fmt: skip
    acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
    mbarrier.arrive(turn.index(1 - W))
    # Groups finish in order: one left in flight means S_j is done and P_{j-1} V_{j-1} may not be.
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    mbarrier.arrive(k_free.index(stage))
    p_new, m_new, alpha, l_i = _softmax(
        s, m_i, l_i, rows, j * s.shape[1], offset, scale_log2, False, MASK
    )
    acc, p = _rescaled(acc, p, p_new, alpha, v_free, prev, 0)
    return acc, m_new, l_i, p


@gluon.jit
def _pair(q, k_smem, v_smem, bars, acc, m_i, l_i, p, j, rows, offset, scale_log2, s_zero,
          W: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Unmasked key tiles j and j + 1 of warpgroup W (j >= 1): S_{j+1} is issued with S_j and
    P_{j-1} V_{j-1}, so it is in flight over the softmax of S_j; nothing in flight crosses the
    loop's edge."""
    _, k_ready, v_ready, k_free, v_free, turn = bars
    a = j % STAGES
    b = (j + 1) % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_ready.index(a), (j // STAGES) & 1)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
    mbarrier.wait(k_ready.index(b), ((j + 1) // STAGES) & 1)
    mbarrier.wait(turn.index(W), j & 1)
    s_a = warpgroup_mma(q, k_smem.index(a).permute((1, 0)), s_zero, use_acc=False,
                        is_async=True)  # fmt: skip
    acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
    s_b = warpgroup_mma(q, k_smem.index(b).permute((1, 0)), s_zero, use_acc=False,
                        is_async=True)  # fmt: skip
    mbarrier.arrive(turn.index(1 - W))
    s_a = warpgroup_mma_wait(num_outstanding=2, deps=(s_a,))
    mbarrier.arrive(k_free.index(a))
    p_a, m_i, alpha, l_i = _softmax(
        s_a, m_i, l_i, rows, j * s_a.shape[1], offset, scale_log2, False, False
    )
    acc, p = _rescaled(acc, p, p_a, alpha, v_free, prev, 1)  # S_{j+1} left in flight
    # Tile j + 1: its scores are (likely) done; O += P_j V_j in this warpgroup's next turn.
    mbarrier.wait(v_ready.index(a), (j // STAGES) & 1)
    mbarrier.wait(turn.index(W), (j + 1) & 1)
    acc = warpgroup_mma(p, v_smem.index(a), acc, is_async=True)
    mbarrier.arrive(turn.index(1 - W))
    s_b = warpgroup_mma_wait(num_outstanding=1, deps=(s_b,))
    mbarrier.arrive(k_free.index(b))
    p_b, m_i, alpha, l_i = _softmax(
        s_b, m_i, l_i, rows, (j + 1) * s_b.shape[1], offset, scale_log2, False, False
    )
    acc, p = _rescaled(acc, p, p_b, alpha, v_free, a, 0)
    return acc, m_i, l_i, p


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, bars, o_ptr, o_row, m0, offset, full, n_tiles, scale_log2,
              W: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
              PAIRS: gl.constexpr):  # fmt: skip
    """One warpgroup: query rows m0 + 64 W .. + 64 over every visible key tile; the two
    warpgroups take turns at the tensor cores, so one's softmax runs under the other's
    products (flash attention 3's ping-pong)."""
    q_bar, k_ready, v_ready, k_free, v_free, turn = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = m0 + W * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    q = q_smem.slice(W * HALF, HALF)

    # Tile 0, masked in case it crosses the diagonal (harmless where it does not).
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    mbarrier.wait(turn.index(W), 0)
    s = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)  # fmt: skip
    mbarrier.arrive(turn.index(1 - W))
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_free.index(0))
    row_zero = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    p0, m_i, _, l_i = _softmax(s, row_zero, row_zero, rows, 0, offset, scale_log2, True, True)
    p = gl.convert_layout(p0.to(q_smem.dtype), p_layout)
    acc = gl.zeros([HALF, D], gl.float32, o_layout)

    # Unmasked tiles two at a time where PAIRS, then one at a time.
    pairs_end = 1
    if PAIRS:
        pairs_end = 1 + gl.maximum(full - 1, 0) // 2 * 2
        for j in range(1, pairs_end, 2):
            acc, m_i, l_i, p = _pair(
                q, k_smem, v_smem, bars, acc, m_i, l_i, p, j, rows, offset, scale_log2, s_zero,
                W, STAGES,
            )  # fmt: skip
    for j in range(pairs_end, full):
        acc, m_i, l_i, p = _tile(
            q, k_smem, v_smem, bars, acc, m_i, l_i, p, j, rows, offset, scale_log2, s_zero,
            W, STAGES, False,
        )  # fmt: skip
    for j in range(gl.maximum(full, 1), n_tiles):
        acc, m_i, l_i, p = _tile(
            q, k_smem, v_smem, bars, acc, m_i, l_i, p, j, rows, offset, scale_log2, s_zero,
            W, STAGES, True,
        )  # fmt: skip

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_smem.index(last), acc, is_async=True)
    acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
    mbarrier.arrive(v_free.index(last))
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = (acc / gl.expand_dims(l_o, 1)).to(o_ptr.dtype.element_ty)
    r = o_row + W * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))
    c = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + gl.expand_dims(r.to(gl.int64) * D, 1) + gl.expand_dims(c, 0), out)


@gluon.jit
def _attn_fwd(q_desc, k_desc, v_desc, o_ptr, q_len, kv_len, scale_log2,
              BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
              PAIRS: gl.constexpr):  # fmt: skip
    ROWS: gl.constexpr = 2 * HALF
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    bh = gl.program_id(1)
    offset = kv_len - q_len
    m0 = pid_m * ROWS
    q_row = bh * q_len + m0
    kv_row = bh * kv_len
    # Tiles every row of the block sees in full, then the tiles crossing the diagonal.
    full = (offset + m0) // BLOCK_N
    n_tiles = gl.cdiv(gl.minimum(offset + m0 + ROWS, kv_len), BLOCK_N)

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [ROWS, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], layout)
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)  # one arrival from each warpgroup
        mbarrier.init(v_free.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    mbarrier.arrive(turn.index(0))  # warpgroup 0 goes first
    fence_async_shared()
    cta_barrier()

    bars = (q_bar, k_ready, v_ready, k_free, v_free, turn)
    gl.warp_specialize(
        [
            (_consumer, (q_smem, k_smem, v_smem, bars, o_ptr, q_row, m0, offset, full, n_tiles,
                         scale_log2, FIRST_WARPGROUP, BLOCK_N, D, STAGES, PAIRS)),
            (_consumer, (q_smem, k_smem, v_smem, bars, o_ptr, q_row, m0, offset, full, n_tiles,
                         scale_log2, SECOND_WARPGROUP, BLOCK_N, D, STAGES, PAIRS)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, q_row, kv_row,
                         n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [240, 24],
    )  # fmt: skip


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of `t` as a (batch * heads * length, head_dim) matrix in rows x head_dim
    tiles (whole tiles only: a tile never straddles two heads, as the lengths are multiples)."""
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    flat = t.view(-1, t.shape[-1])
    layout = gl.NVMMASharedLayout.get_default_for([rows, t.shape[-1]], dtype)
    return TensorDescriptor(
        flat, list(flat.shape), list(flat.stride()), [rows, t.shape[-1]], layout
    )


def _refusal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int, stages: int, pairs: bool
):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    if not q.dim() == k.dim() == v.dim() == 4:
        return f"needs 4-D q, k and v; got {q.dim()}, {k.dim()}, {v.dim()} dimensions"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"needs bf16 or fp16 q, k and v; got {q.dtype}, {k.dtype}, {v.dtype}"
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return "needs contiguous (batch, heads, length, head_dim) q, k and v"
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        return f"k {tuple(k.shape)} and v {tuple(v.shape)} do not match q {tuple(q.shape)}"
    if q.shape[2] > k.shape[2]:
        return f"q_len {q.shape[2]} > kv_len {k.shape[2]}"
    d = q.shape[3]
    if d not in (64, 128):
        return f"head_dim {d}: 64 or 128 only"
    if q.shape[2] % BLOCK_M or k.shape[2] % block_n:
        return (
            f"q_len {q.shape[2]} and kv_len {k.shape[2]} must be multiples of {BLOCK_M}, {block_n}"
        )
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if pairs and block_n != 64:
        return "pairs need 64-key tiles (at 128 they spill and ptxas serialises the products)"
    if q.shape[0] * q.shape[1] > 65535:
        return f"batch x heads {q.shape[0] * q.shape[1]} above the grid's 65535"
    shared = 2 * d * (BLOCK_M + 2 * stages * block_n) + 1024  # tiles, barriers with room
    if shared > SHARED_BYTES:
        return f"block_n {block_n} at {stages} stages needs {shared} bytes of shared memory"
    if any(t.data_ptr() % 16 for t in (q, k, v)):
        return "needs 16-byte aligned q, k and v (TMA)"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {q.device}"
    if k.device != q.device or v.device != q.device:
        return f"q, k and v on {q.device}, {k.device}, {v.device}"
    return None


def kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_n: int = 128,
    num_stages: int = 2,
    pairs: bool = False,
) -> torch.Tensor:
    """Causal attention of q over k and v (bottom-right aligned), in q's dtype."""
    why = _refusal(q, k, v, block_n, num_stages, pairs)
    if why is not None:
        raise ValueError(f"gluon prefill attention {why}; use triton_prefill_attention.py")
    b, h, q_len, d = q.shape
    o = torch.empty_like(q)
    if o.numel() == 0:
        return o
    descs = [_descriptor(t, rows) for t, rows in ((q, BLOCK_M), (k, block_n), (v, block_n))]
    with torch.cuda.device(q.device):
        _attn_fwd[(q_len // BLOCK_M, b * h)](
            *descs, o, q_len, k.shape[2], LOG2E / math.sqrt(d), BLOCK_N=block_n, D=d,
            STAGES=num_stages, PAIRS=pairs, num_warps=4,
        )  # fmt: skip
    return o

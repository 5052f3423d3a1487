"""GQA decode in Gluon for Hopper (sm_90), for batched decode: a program takes one (sequence, KV
head) pair over its cache (or over a split of it, below), so the KV is read once and no merge
kernel follows, and one loader warp keeps a TMA ring of K and V tiles full while one warpgroup
computes.

Session 26 measured SDPA (cuDNN) streaming the cache at 95 % of the read ceiling at b16-kv8192
and b64-kv2048, against 0.930x of it for the Triton candidate with its loads through tensor
descriptors: a split kernel, its merge and loads issued from the computing warps. Here the
loader warp brings the program's queries once and then each tile of `block_n` keys (K and V,
each in two 64-column chunks, 128-byte swizzled) into a ring of `num_stages` buffers, a buffer
as soon as the warpgroup gives it back. The warpgroup multiplies on the tensor cores: the
group's query heads are the first rows of a 64-row wgmma operand (the rows after them are the
next heads' queries, or zeros past the last, and are never stored), S = Q K^T, the online
softmax in registers, O += P V, then O / l for the group's rows; a tile's scores and the tile
before's P V are issued together, so the softmax runs while P V is on the tensor cores.

Where (sequence, KV head) pairs leave SMs idle (b1 x 8 KV heads: 8 programs), the cache is cut
into splits of `split_tokens` (0: as many as fill one wave of one program an SM), each split's
program stores its normalised output and log2-sum-exp for the group's rows, and the last of a
pair's programs to arrive (an acq_rel count after a barrier that puts its stores first) merges
them, a block of splits a load, writes the output and resets the count: no merge kernel. The
counts live in one buffer per device, zero between calls, so calls on one device must not
overlap (one stream, as torch runs them).

Launched with programmatic dependent launch: both partitions wait (griddepcontrol.wait) for the
kernel before this one before touching global memory, and the loader then lets the next kernel
launch. With `early_history` the loader first asks for the tiles that fill its ring, before its
wait, but not the cache's last tile, as the Triton candidate's `early_history`: right where the
kernel before writes no slot of the cache but the last (the new token's, as an append-then-attend
step does) and lets this one launch only after its own wait (else a kernel further back may
still be writing). The queries are always read after the wait.

On H100s (sessions 41-43): against sdpa-gqa (cuDNN) 1.002-1.006x at b16-kv8192 and b64-kv2048, both
streaming the two caches at about 3.0 TB/s, and 1.000x in the Llama b16 block; at batch 1, with the
merge loading a block of splits at once (one split a round trip cost 6.5-7.8 us), 1.031-1.043x at
b1-kv32768 (a tie with the Triton fold) and 1.003-1.011x at b1-kv131072, 0.994x at b4-kv131072. In
the Llama b1 blocks, at both batch-1 entries with early_history: 1.014x session 40's tables at 4k (4
layers) and 1.020x at 32k (32 layers); with the merge's weights loaded once a row (session 43),
1.019x and 1.021x.

On the H200 (session 47, a 4.55 TB/s host), at both batch-1 entries with early_history: 1.015-1.021x
session 40's tables in the Llama b1 blocks over two calls (4k at 4 and 32 layers, 32k at 32), and
the block tables in force take it there; at the b16 entry 0.991x in the Llama b16 block (SDPA keeps
it).

Pipelining the products and starting each split at its own tile changed nothing; two buffers
both held by the pipeline (block_n 64 at 2 stages) cost 8 %.

Runs on sm_90 with bf16 or fp16 contiguous inputs, head_dim 128, at most 64 query heads a KV
head and a cache length a multiple of the tile; anything else is a ValueError naming what (the
Triton candidate takes it). Gluon has no interpreter: the CPU tests build it for sm_90, and the
GPU tests check its outputs."""

import math

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
    "block_n": [32, 64, 128],
    "num_stages": [2, 3, 4, 6, 8],
    "split_tokens": [0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
    "early_history": [False, True],
}

LOG2E = 1.4426950408889634
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
HEAD_DIM = 128
ROWS = gl.constexpr(64)  # one wgmma is 64 rows tall: a program's query heads, padded
CHUNK = gl.constexpr(64)  # columns of a shared-memory chunk (a 128-byte swizzled row)
CHUNKS = gl.constexpr(HEAD_DIM // 64)


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait: the kernel before this one has finished and its writes are seen."""
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _gdc_launch_dependents():
    """griddepcontrol.launch_dependents: the next kernel may launch (it still waits for this one
    before reading what this one writes)."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _load_tile(k_desc, v_desc, k_smem, v_smem, ready, free, kv_row, j, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr):  # fmt: skip
    """Tile j's K and V into its ring buffer, once the warpgroup has given the buffer back (a
    fresh barrier passes the first wait, parity 1)."""
    stage = j % STAGES
    row = kv_row + j * BLOCK_N
    mbarrier.wait(free.index(stage), ((j // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(stage), 2 * CHUNKS * k_desc.block_type.nbytes)
    for c in gl.static_range(CHUNKS):
        i = stage * CHUNKS + c
        tma_load(k_desc, [row, c * CHUNK], ready.index(stage), k_smem.index(i))
        tma_load(v_desc, [row, c * CHUNK], ready.index(stage), v_smem.index(i))


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, free, q_row, kv_row,
            n_tiles, last_split, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            EARLY: gl.constexpr):  # fmt: skip
    """One warp: the queries once, then each tile's K and V into the ring. EARLY: the first
    tiles that fill the ring are asked for before the wait, all but the cache's last tile (the
    last split's last), which holds the slot the kernel before may write."""
    early = 0
    if EARLY:
        early = gl.minimum(n_tiles - last_split, STAGES)
        for j in range(early):
            _load_tile(k_desc, v_desc, k_smem, v_smem, ready, free, kv_row, j, BLOCK_N, STAGES)
    _gdc_wait()
    _gdc_launch_dependents()
    mbarrier.expect(q_bar, CHUNKS * q_desc.block_type.nbytes)
    for c in gl.static_range(CHUNKS):
        tma_load(q_desc, [q_row, c * CHUNK], q_bar, q_smem.index(c))
    for j in range(early, n_tiles):
        _load_tile(k_desc, v_desc, k_smem, v_smem, ready, free, kv_row, j, BLOCK_N, STAGES)


@gluon.jit
def _scores(q_smem, k_smem, base, s_zero):
    """S = Q K^T over a buffer's two K chunks (not waited)."""
    s = warpgroup_mma(q_smem.index(0), k_smem.index(base).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)  # fmt: skip
    return warpgroup_mma(q_smem.index(1), k_smem.index(base + 1).permute((1, 0)), s,
                         is_async=True)  # fmt: skip


@gluon.jit
def _attend(q_smem, k_smem, v_smem, q_bar, ready, free, out_ptr, part_ptr, lse_ptr, count_ptr,
            out_row, group, unit, split, n_splits, n_tiles, scale_log2, BLOCK_N: gl.constexpr,
            STAGES: gl.constexpr, SPLIT: gl.constexpr, MERGE_ROWS: gl.constexpr):  # fmt: skip
    """One warpgroup, software-pipelined: tile j's scores and tile j - 1's P V are issued
    together, and tile j's softmax runs while P V is on the tensor cores (the output is rescaled
    by a tile's factor one tile late, before that tile's P V is added); each buffer is given back
    once its P V is done; then the group's rows of O / l (SPLIT: the split's, and the pair's
    merge where this program arrives last)."""
    _gdc_wait()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CHUNK, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    o0 = gl.zeros([ROWS, CHUNK], gl.float32, o_layout)
    o1 = o0
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(_scores(q_smem, k_smem, 0, s_zero),))
    m_i = gl.max(s, axis=1) * scale_log2
    p = gl.exp2(s * scale_log2 - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, axis=1)
    p16 = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    a = gl.full([ROWS, 1], 1.0, gl.float32, o_layout)
    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES * CHUNKS
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        s = _scores(q_smem, k_smem, stage * CHUNKS, s_zero)
        o0 = warpgroup_mma(p16, v_smem.index(prev), o0 * a, is_async=True)
        o1 = warpgroup_mma(p16, v_smem.index(prev + 1), o1 * a, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=2, deps=(s,))  # in order: S_j is done
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
        p = gl.exp2(s * scale_log2 - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        a = gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
        o0, o1, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, p16))
        mbarrier.arrive(free.index((j - 1) % STAGES))
        p16 = gl.convert_layout(p.to(q_smem.dtype), p_layout)
    last = (n_tiles - 1) % STAGES
    o0 = warpgroup_mma(p16, v_smem.index(last * CHUNKS), o0 * a, is_async=True)
    o1 = warpgroup_mma(p16, v_smem.index(last * CHUNKS + 1), o1 * a, is_async=True)
    o0, o1, p16 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, p16))
    mbarrier.arrive(free.index(last))
    rows = gl.arange(0, ROWS, layout=o_rows)
    cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, o_layout))
    inv_l = gl.expand_dims(gl.convert_layout(1.0 / l_i, o_rows), 1)
    mask = gl.expand_dims(rows < group, 1) & gl.expand_dims(cols < CHUNK, 0)
    if SPLIT:
        # The split's normalised output and log2-sum-exp: (pair, split, row, column).
        cell = gl.expand_dims(rows * (CHUNKS * CHUNK), 1) + gl.expand_dims(cols, 0)
        parts = part_ptr + (unit * n_splits + split).to(gl.int64) * (ROWS * CHUNKS * CHUNK)
        gl.store(parts + cell, o0 * inv_l, mask=mask)
        gl.store(parts + cell + CHUNK, o1 * inv_l, mask=mask)
        lse = gl.convert_layout(m_i + gl.log2(l_i), o_rows)
        gl.store(lse_ptr + (unit * n_splits + split) * ROWS + rows, lse, mask=rows < group)
        cta_barrier()
        arrived = gl.atomic_add(count_ptr + unit, 1, sem="acq_rel", scope="gpu")
        if arrived == n_splits - 1:
            gl.store(count_ptr + unit, 0)  # every split has counted: ready for the next call
            _merge(part_ptr, lse_ptr, out_ptr, unit, n_splits, out_row, group, MERGE_ROWS)
    else:
        ptrs = out_ptr + gl.expand_dims((out_row + rows).to(gl.int64) * (CHUNKS * CHUNK), 1)
        ptrs = ptrs + gl.expand_dims(cols, 0)
        gl.store(ptrs, (o0 * inv_l).to(out_ptr.dtype.element_ty), mask=mask)
        gl.store(ptrs + CHUNK, (o1 * inv_l).to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _merge(part_ptr, lse_ptr, out_ptr, unit, n_splits, out_row, group,
           MERGE_ROWS: gl.constexpr):  # fmt: skip
    """A pair's splits, weighted by their log2-sum-exp, into the group's rows of the output,
    `MERGE_ROWS` rows at a time: as many splits' partials as make 64 values a thread are loaded
    at once (one round trip for up to 16 splits of a 4-head group), with a running maximum
    across blocks of splits. A warp takes whole rows, so a split's weight for a row is loaded
    and exponentiated once a thread, not once a column."""
    dims: gl.constexpr = CHUNKS * CHUNK
    MERGE_S: gl.constexpr = 64 // MERGE_ROWS  # splits a load
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, 4, 1], [2, 1, 0])
    weights: gl.constexpr = gl.SliceLayout(2, layout)  # splits x rows
    sp = gl.arange(0, MERGE_S, layout=gl.SliceLayout(1, weights))
    rr = gl.arange(0, MERGE_ROWS, layout=gl.SliceLayout(0, weights))
    col = gl.arange(0, dims, layout=gl.SliceLayout(0, gl.SliceLayout(0, layout)))
    col = gl.expand_dims(gl.expand_dims(col, 0), 0)
    for r0 in range(0, group, MERGE_ROWS):
        row = gl.expand_dims(r0 + rr, 0)  # 1 x rows
        cell = gl.expand_dims(row * dims, 2) + col  # 1 x rows x dims
        ok = row < group
        m = gl.full([1, MERGE_ROWS, 1], float("-inf"), gl.float32, layout)
        den = gl.zeros([1, MERGE_ROWS, 1], gl.float32, layout)
        acc = gl.zeros([1, MERGE_ROWS, dims], gl.float32, layout)
        for s0 in range(0, n_splits, MERGE_S):
            at = gl.expand_dims(unit * n_splits + s0 + sp, 1)  # splits x 1
            live = (s0 + gl.expand_dims(sp, 1) < n_splits) & ok
            lse = gl.load(lse_ptr + at * ROWS + row, mask=live, other=float("-inf"))
            lse = gl.expand_dims(lse, 2)
            parts = part_ptr + gl.expand_dims(at.to(gl.int64) * (ROWS * dims), 2)
            o = gl.load(parts + cell, mask=gl.expand_dims(live, 2), other=0.0)
            m_new = gl.maximum(m, gl.max(lse, axis=0, keep_dims=True))
            keep = gl.exp2(m - m_new)
            w = gl.exp2(lse - m_new)
            acc = acc * keep + gl.sum(w * o, axis=0, keep_dims=True)
            den = den * keep + gl.sum(w, axis=0, keep_dims=True)
            m = m_new
        out = (acc / den).to(out_ptr.dtype.element_ty)
        mask = gl.expand_dims(ok, 2) & (col < dims)  # col < dims: all true, the tile's shape
        gl.store(out_ptr + out_row.to(gl.int64) * dims + cell, out, mask=mask)


@gluon.jit
def _gqa_kernel(q_desc, k_desc, v_desc, out_ptr, part_ptr, lse_ptr, count_ptr, q_heads,
                kv_heads, kv_len, tiles_per_split, scale_log2, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr, SPLIT: gl.constexpr, MERGE_ROWS: gl.constexpr,
                EARLY: gl.constexpr):  # fmt: skip
    unit = gl.program_id(0)  # sequence * kv_heads + KV head
    split = gl.program_id(1)
    n_splits = gl.num_programs(1)
    group = q_heads // kv_heads
    q_row = unit // kv_heads * q_heads + unit % kv_heads * group
    first = split * tiles_per_split
    n_tiles = gl.minimum(tiles_per_split, kv_len // BLOCK_N - first)
    kv_row = unit * kv_len + first * BLOCK_N

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [CHUNKS, ROWS, CHUNK], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_N, CHUNK], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_N, CHUNK], v_desc.layout)
    layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], layout)
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    fence_async_shared()
    cta_barrier()
    gl.warp_specialize(
        [
            (_attend, (q_smem, k_smem, v_smem, q_bar, ready, free, out_ptr, part_ptr, lse_ptr,
                       count_ptr, q_row, group, unit, split, n_splits, n_tiles, scale_log2,
                       BLOCK_N, STAGES, SPLIT, MERGE_ROWS)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, free, q_row,
                       kv_row, n_tiles, (split == n_splits - 1).to(gl.int32), BLOCK_N, STAGES,
                       EARLY)),
        ],
        [1],
        [24],
    )  # fmt: skip


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of `t` as a (rows of all but the last dim, last dim) matrix in rows x 64
    tiles."""
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    flat = t.view(-1, t.shape[-1])
    layout = gl.NVMMASharedLayout.get_default_for([rows, 64], dtype)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, 64], layout)


# The arrival counts, per device: zero between calls (the last program of a pair resets its
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


def split_tiles(pairs: int, tiles: int, sms: int, split_tokens: int, block_n: int) -> int:
    """Tiles per split: `split_tokens` worth, or (0) as many as leave one wave of one program an
    SM (8 pairs over 1024 tiles at 132 SMs: 16 splits of 64 tiles; 128 pairs: no split)."""
    if split_tokens:
        return min(tiles, max(1, split_tokens // block_n))
    return triton.cdiv(tiles, max(1, min(tiles, sms // pairs)))


def shared_bytes(block_n: int, stages: int) -> int:
    """Shared memory of a program: the queries (64 rows), the ring of K and V tiles, barriers
    with room."""
    return 2 * HEAD_DIM * (64 + 2 * stages * block_n) + 1024


def _refusal(q, k_cache, v_cache, block_n: int, stages: int):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        return "needs q (batch, q_heads, head_dim) and equal caches (batch, kv_heads, len, dim)"
    if q.dtype not in (torch.bfloat16, torch.float16) or any(
        t.dtype != q.dtype for t in (k_cache, v_cache)
    ):
        return f"needs bf16 or fp16 inputs of one dtype; got {q.dtype}, {k_cache.dtype}"
    if not all(t.is_contiguous() for t in (q, k_cache, v_cache)):
        return "needs contiguous inputs"
    b, hq, d = q.shape
    kb, hkv, n, kd = k_cache.shape
    if d != HEAD_DIM or kd != d or kb != b:
        return f"head_dim {HEAD_DIM} only, q and caches alike; got q {tuple(q.shape)}, " + (
            f"cache {tuple(k_cache.shape)}"
        )
    if hkv == 0 or hq % hkv or hq // hkv > 64:
        return f"q_heads {hq} on kv_heads {hkv}: whole groups of at most 64 only"
    if n == 0 or n % block_n:
        return f"kv_len {n}: a positive multiple of {block_n} only"
    if b * hkv * n >= 2**31:
        return f"{b * hkv * n} cache rows above TMA's 32-bit coordinates"
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if shared_bytes(block_n, stages) > SHARED_BYTES:
        return f"block_n {block_n} at {stages} stages needs {shared_bytes(block_n, stages)} bytes"
    if any(t.data_ptr() % 16 for t in (q, k_cache, v_cache)):
        return "needs 16-byte aligned inputs (TMA)"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {q.device}"
    if any(t.device != q.device for t in (k_cache, v_cache)):
        return f"inputs on {[str(t.device) for t in (q, k_cache, v_cache)]}"
    return None


def kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_n: int = 64,
    num_stages: int = 3,
    split_tokens: int = 0,
    early_history: bool = False,
) -> torch.Tensor:
    if split_tokens < 0 or split_tokens % block_n:
        raise ValueError(
            f"gluon GQA decode: split_tokens {split_tokens} is not 0 or a multiple of block_n "
            f"{block_n}"
        )
    why = _refusal(q, k_cache, v_cache, block_n, num_stages)
    if why is not None:
        raise ValueError(f"gluon GQA decode {why}; use triton_gqa_decode.py")
    b, hq, d = q.shape
    hkv, n = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    if b * hq == 0:
        return out
    descs = [_descriptor(q, 64), _descriptor(k_cache, block_n), _descriptor(v_cache, block_n)]
    pairs, tiles = b * hkv, n // block_n
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    per = split_tiles(pairs, tiles, sms, split_tokens, block_n)
    splits = triton.cdiv(tiles, per)
    if splits > 1:
        parts = torch.empty((pairs * splits, 64, d), device=q.device, dtype=torch.float32)
        lse = torch.empty((pairs * splits, 64), device=q.device, dtype=torch.float32)
        counts = _arrival_counts(pairs, q.device)
    else:
        parts = lse = counts = out  # not read
    # The merge's rows a pass (at least 4: its four warps take a row each).
    merge_rows = min(32, max(4, triton.next_power_of_2(hq // hkv)))
    with torch.cuda.device(q.device):
        _gqa_kernel[(pairs, splits)](
            *descs, out, parts, lse, counts, hq, hkv, n, per, LOG2E / math.sqrt(d),
            BLOCK_N=block_n, STAGES=num_stages, SPLIT=splits > 1, MERGE_ROWS=merge_rows,
            EARLY=bool(early_history), num_warps=4, launch_pdl=True,
        )  # fmt: skip
    return out

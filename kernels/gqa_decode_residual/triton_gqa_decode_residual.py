"""GQA decode, its output projection and the residual add in two Triton kernels, with no merge
kernel between them: y = attention(q, k, v) W_o^T + r.

The split kernel is gqa_decode's (flash-decoding): a program reads one KV head's split of the
cache once for the group's query heads and stores each head's partial output and log-sum-exp.
The projection kernel takes the merge's place. Its program (rows, heads) holds `block_r` rows
of W_o by the columns of `heads_per_program` query heads: head by head, it merges that head's
partials (one round trip a sequence: every split's weight and partial at once) and adds its
tile times them into float32 sums on the CUDA cores, the tile `ahead` heads on already asked
for; then it stores the sums, and the last of a row block's programs to arrive (an acq_rel
count, after a barrier that puts every thread's stores first) adds the programs' sums in a
fixed order, adds r, writes the rows and resets the count. A head's partials are read by each
of the hidden / block_r programs that hold its columns (32 at block_r 128 and 4096 rows); the
sequences go up to 16 to a program.

On Hopper and later both kernels are launched with programmatic dependent launch. The split
kernel waits (`gdc_wait`) before it reads anything (with `early_history`, before it reads
anything but the history of its first tile: gqa_decode's option, right where the kernel before
writes no slot of the cache but the last), then lets the projection kernel launch, whose
programs load their first `ahead` tiles of W_o, which nothing in the stream writes, before
their own wait: the weight streams while the attention runs. After its wait the projection
kernel lets the kernel after it launch, or with `late_dependents` only once it has stored its
sums and counted (so that kernel's early loads do not stream beside this one's weight).

The counts live in one buffer per device, zeroed once when it is made; calls on the same device
must therefore not overlap (run them on one stream, as torch does by default).

Measured on an H100 in the Llama b1 block (session 40): correct, but 0.631-0.962x against the
split, merge and Triton o GEMV then in force (session 40's tables; the best one head a program,
64 rows, late_dependents; 0.978x for a build of one head a program on tensor cores, at 1885e18);
alone, the projection kernel streams W_o at 30-39 % of DRAM peak.
"""

import functools
import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_n": [16, 32, 64, 128],
    "split_tokens": [0, 16, 32, 64, 128, 256, 512, 1024, 2048],
    "num_stages": [2, 3, 4],
    "early_history": [False, True],
    "block_r": [16, 32, 64, 128, 256],
    "heads_per_program": [1, 2, 4, 8, 16, 32],
    "ahead": [1, 2],
    "late_dependents": [False, True],
    "num_warps": [4, 8],
}
LOG2E = 1.4426950408889634
# One projection program reads every split of its head at once: at most this many.
MAX_SPLITS = 64
# Splits when split_tokens is 0: gqa_decode's H200 choice for one sequence at 4096 tokens.
AUTO_SPLIT_TOKENS = 128


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, po_ptr, plse_ptr, kv_len, tokens_per_split, n_splits, scale_log2,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    HKV: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // HKV
    h = pid_bh % HKV
    d = tl.arange(0, D)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    start = pid_s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, kv_len)
    if EARLY:
        # the first tile's history (every slot but the last) before the wait
        offs0 = start + tl.arange(0, BLOCK_N)
        ok0 = offs0 < end
        k_rows0 = k_base + offs0.to(tl.int64)[:, None] * stride_kn + d[None, :]
        v_rows0 = v_base + offs0.to(tl.int64)[:, None] * stride_vn + d[None, :]
        old = (ok0 & (offs0 < kv_len - 1))[:, None]
        k0 = tl.load(k_rows0, mask=old, other=0.0)
        v0 = tl.load(v_rows0, mask=old, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    g = tl.arange(0, GROUP_PAD)
    g_ok = g < GROUP
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + (h * GROUP + g)[:, None] * stride_qh
    q = tl.load(q_rows + d[None, :], mask=g_ok[:, None], other=0.0)
    m_i = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, D), dtype=tl.float32)
    first = start
    if EARLY:
        # the new token's slot, if it is in the first tile, after the wait
        new = (ok0 & (offs0 == kv_len - 1))[:, None]
        k0 = tl.where(new, tl.load(k_rows0, mask=new, other=0.0), k0)
        v0 = tl.where(new, tl.load(v_rows0, mask=new, other=0.0), v0)
        m_i, alpha, p, l_i = _scores(q, k0, ok0, m_i, l_i, scale_log2)
        acc = tl.dot(p.to(v0.dtype), v0, acc * alpha[:, None], input_precision="ieee")
        first = start + BLOCK_N
    for n0 in range(first, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < end
        rows = offs.to(tl.int64)[:, None]
        k = tl.load(k_base + rows * stride_kn + d[None, :], mask=ok[:, None], other=0.0)
        m_i, alpha, p, l_i = _scores(q, k, ok, m_i, l_i, scale_log2)
        v = tl.load(v_base + rows * stride_vn + d[None, :], mask=ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    head = (b * HKV + h) * GROUP + g
    part = head.to(tl.int64) * n_splits + pid_s
    tl.store(po_ptr + part[:, None] * D + d[None, :], acc / l_i[:, None], mask=g_ok[:, None])
    tl.store(plse_ptr + part, m_i + tl.log2(l_i), mask=g_ok)


@triton.jit
def _scores(q, k, ok, m_i, l_i, scale_log2):
    """One tile of keys (rows past `ok` masked off) into the online softmax: the new running
    max, the rescale of what came before, the tile's weights and the new running sum."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee")
    s = tl.where(ok[None, :], s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _merge_project(
    po_ptr, plse_ptr, w_ptr, r_ptr, y_ptr, ws_ptr, count_ptr, batch, n_rows, n_splits,
    HQ: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
    HEADS: tl.constexpr, AHEAD: tl.constexpr, SEQS: tl.constexpr, PDL: tl.constexpr,
    LATE_DEPENDENTS: tl.constexpr,
):  # fmt: skip
    groups: tl.constexpr = HQ // HEADS
    block = tl.program_id(0) // groups
    group = tl.program_id(0) % groups
    chunk = tl.program_id(1)  # of SEQS sequences
    rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
    rows_ok = rows < n_rows
    d = tl.arange(0, D)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * (HQ * D) + group * (HEADS * D) + d[None, :]
    # the first AHEAD heads' tiles of W_o before the wait (nothing in the stream writes W_o)
    w_next = _w_tile(w_rows, rows_ok)
    w_after = w_next
    if AHEAD == 2 and HEADS > 1:
        w_after = _w_tile(w_rows + D, rows_ok)
    if PDL:
        tl.extra.cuda.gdc_wait()
        if not LATE_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < n_splits
    col = tl.arange(0, SEQS)
    b0 = chunk * SEQS
    acc = tl.zeros((BLOCK_R, SEQS), dtype=tl.float32)  # a sequence a column
    for i in tl.static_range(HEADS):
        w = w_next.to(tl.float32)
        # the tile AHEAD heads on is asked for before this head's partials are read
        if AHEAD == 2:
            w_next = w_after
            if i + 2 < HEADS:
                w_after = _w_tile(w_rows + (i + 2) * D, rows_ok)
        elif i + 1 < HEADS:
            w_next = _w_tile(w_rows + (i + 1) * D, rows_ok)
        head = group * HEADS + i
        for b in range(b0, tl.minimum(b0 + SEQS, batch)):
            part = (b * HQ + head).to(tl.int64) * n_splits + sp
            lse = tl.load(plse_ptr + part, mask=s_ok, other=float("-inf"))
            o = tl.load(po_ptr + part[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0)
            weight = tl.exp2(lse - tl.max(lse, axis=0))
            attn = tl.sum(weight[:, None] * o, axis=0) / tl.sum(weight, axis=0)
            # the attention rounded to the model dtype, as the unfused ops hand it on
            attn = attn.to(w_ptr.dtype.element_ty).to(tl.float32)
            prod = tl.sum(w * attn[None, :], axis=1)
            acc = tl.where(col[None, :] == b - b0, acc + prod[:, None], acc)
    seqs = b0 + col
    ws = ws_ptr + (seqs[None, :] * groups + group).to(tl.int64) * n_rows + rows[:, None]
    tl.store(ws, acc, mask=rows_ok[:, None] & (seqs < batch)[None, :])
    # The barrier puts every thread's stores before the count, whose release publishes them at
    # GPU scope; the last program's count acquires all the others'.
    tl.debug_barrier()
    count = count_ptr + block * tl.num_programs(1) + chunk
    arrived = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
    if PDL and LATE_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()
    if arrived == groups - 1:
        tl.store(count, 0)  # every group has counted: ready for the next call
        g = tl.arange(0, groups)
        for b in range(b0, tl.minimum(b0 + SEQS, batch)):
            prods = tl.load(
                ws_ptr + (b * groups + g).to(tl.int64)[:, None] * n_rows + rows[None, :],
                mask=rows_ok[None, :], other=0.0, cache_modifier=".cg",
            )  # fmt: skip
            res = tl.load(r_ptr + b * n_rows + rows, mask=rows_ok, other=0.0).to(tl.float32)
            out = tl.sum(prods, axis=0) + res
            tl.store(y_ptr + b * n_rows + rows, out.to(y_ptr.dtype.element_ty), mask=rows_ok)


@triton.jit
def _w_tile(ptrs, rows_ok):
    """One head's columns of W_o for the program's rows, streamed once (evict first)."""
    return tl.load(ptrs, mask=rows_ok[:, None], other=0.0, eviction_policy="evict_first")


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


# The arrival counts, per device: zero between calls (the last program of a row block resets
# its count). Every buffer is kept, as a CUDA graph may hold any of them.
_COUNTS: dict[torch.device, list[torch.Tensor]] = {}


def _arrival_counts(n: int, device: torch.device) -> torch.Tensor:
    held = _COUNTS.setdefault(device, [])
    if held and held[-1].numel() >= n:
        return held[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A buffer made while a graph is captured is zeroed only when the graph replays: this
        # call's graph zeroes its own counts, and no other call shares them.
        return torch.zeros(n, dtype=torch.int32, device=device)
    held.append(
        torch.zeros(max(n, 2 * held[-1].numel() if held else 0), dtype=torch.int32, device=device)
    )
    return held[-1]


def split_size(kv_len: int, split_tokens: int, block_n: int) -> int:
    """Tokens a split: `split_tokens` (AUTO_SPLIT_TOKENS for 0) rounded up to whole tiles, and
    raised where that would make more than MAX_SPLITS splits."""
    tokens = triton.cdiv(split_tokens or AUTO_SPLIT_TOKENS, block_n) * block_n
    fewest = triton.cdiv(triton.cdiv(kv_len, MAX_SPLITS), block_n) * block_n
    return max(tokens, fewest)


def kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    w_o: torch.Tensor,
    r: torch.Tensor,
    block_n: int = 64,
    split_tokens: int = 0,
    num_stages: int = 3,
    early_history: bool = False,
    block_r: int = 128,
    heads_per_program: int = 8,
    ahead: int = 2,
    late_dependents: bool = False,
    num_warps: int = 8,
) -> torch.Tensor:
    b, hq, d = q.shape
    _, hkv, kv_len, _ = k_cache.shape
    hidden = w_o.shape[0]
    if kv_len == 0:
        raise ValueError("the cache is empty: attention needs at least one cached token")
    if w_o.shape != (hidden, hq * d) or r.shape != (b, hidden):
        raise ValueError(
            f"w_o must be (hidden, {hq * d}) and r ({b}, hidden), "
            f"got {tuple(w_o.shape)} and {tuple(r.shape)}"
        )
    if d & (d - 1) or hq & (hq - 1):
        raise ValueError(f"head_dim {d} and q_heads {hq} must be powers of two")
    if ahead not in (1, 2):
        raise ValueError(f"ahead {ahead}: 1 or 2 heads' tiles of W_o in flight")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    w_o, r = w_o.contiguous(), r.contiguous()
    group = hq // hkv
    tokens = split_size(kv_len, split_tokens, block_n)
    n_splits = triton.cdiv(kv_len, tokens)
    part_o = torch.empty((b * hq * n_splits, d), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((b * hq * n_splits,), device=q.device, dtype=torch.float32)
    pdl = _pdl(q.device)
    _split_kernel[(b * hkv, n_splits)](
        q, k_cache, v_cache, part_o, part_lse, kv_len, tokens, n_splits, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HKV=hkv, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=d,
        BLOCK_N=block_n, PDL=pdl, EARLY=bool(early_history), num_warps=4,
        num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    seqs = min(16, triton.next_power_of_2(b))
    blocks, chunks = triton.cdiv(hidden, block_r), triton.cdiv(b, seqs)
    heads = min(heads_per_program, hq)
    y = torch.empty((b, hidden), device=q.device, dtype=q.dtype)
    products = torch.empty((b * (hq // heads) * hidden,), device=q.device, dtype=torch.float32)
    _merge_project[(blocks * (hq // heads), chunks)](
        part_o, part_lse, w_o, r, y, products, _arrival_counts(blocks * chunks, q.device), b,
        hidden, n_splits, HQ=hq, D=d, BLOCK_R=block_r,
        BLOCK_S=max(2, triton.next_power_of_2(n_splits)), HEADS=heads, AHEAD=ahead, SEQS=seqs,
        PDL=pdl, LATE_DEPENDENTS=bool(late_dependents),
        num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    return y

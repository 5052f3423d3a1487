"""GQA decode in Triton, flash-decoding style: the cache is cut into splits along its length; a
program reads one KV head's split once and serves all the query heads of its group (rows of one
tl.dot, padded to 16), keeping an online softmax; the splits are then merged by their
log-sum-exp. `split_tokens` 0 (the default) splits at AUTO_SPLIT_TOKENS where that gives every
SM a program, else into enough splits to give every SM `programs_per_sm` programs.

`merge` "kernel" merges in a second kernel, a program a query head. "fold" launches one kernel
only: each program counts itself in on its KV head's counter once its partials are stored, and
the last of the KV head's splits to arrive merges them for the group's query heads (all at once
where they fit in 64 values a thread) and sets the count back to 0. The counts live in one
buffer per device, zeroed once when it is made, so no call pays a kernel to zero them (nor does a
CUDA graph's replay); calls on the same device must therefore not overlap (run them on one
stream, as torch does by default).

On Hopper and later the kernels are launched with programmatic dependent launch: each waits
(`gdc_wait`) for the kernel before it before it reads anything, then lets the kernel after it
launch, so a launch's latency passes while the kernel before it drains.

`early_history` True lets the split kernel load its first tile of K and V before the wait, all
but the cache's last slot (the new token's), which it reads after the wait, so the cache's
history streams while the kernel before drains. It is right where (1) the kernel before this one
writes no slot of the cache but the last, as in a decode step that appends the new token and
then attends, and (2) that kernel lets this one launch only after its own wait (or is launched
without programmatic dependent launch), so every kernel before it is done. The first tile stays
in registers across the wait: about 210 registers a thread at 64-token tiles with 4 warps or
128 with 8 (78 without), and spills at 128 with 4 warps or 256 with 8.

`prefetch_l2` True has the split kernel, before the wait, ask L2 for every 128-byte line of its
split's K and V (`prefetch.global.L2`), holding no register. A prefetch changes no value (L2 is
where every SM's reads and writes meet), so it may cover the new slot too. On a CUDA device
only: the interpreter has no inline PTX.

`early_dependents` True has the merge kernel let the kernel after it launch before its own wait,
not after it, so that kernel (in a decoder block, the output projection, whose weights nothing
writes) streams what it may read early while the split kernel still runs; without it, it
launches only once the split kernel is done. It is right only where the kernel after the merge
reads nothing before its wait that a kernel before it writes, and writes nothing before its wait
that one of them reads: that kernel's wait still waits for the merge, and the merge's for the
split. With early_history the next call's split kernel may so launch, and read the cache's
history, while this call's split runs: right because the split kernel writes no slot of the
cache."""

import functools
import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_n": [16, 32, 64, 128, 256],
    "split_tokens": [0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
    "programs_per_sm": [1, 2, 4, 8],
    "num_warps": [1, 2, 4, 8],
    "num_stages": [1, 2, 3, 4, 5],
    "use_dot": [True, False],
    "merge": ["kernel", "fold"],
    "early_history": [False, True],
    "prefetch_l2": [False, True],
    "early_dependents": [False, True],
}
MERGES = ("kernel", "fold")

LOG2E = 1.4426950408889634
# On the H200 (session 8, call 1), 1024-token splits were the fastest of eight configurations at
# batch 1 with 32768 tokens (41.9 us) and 0.7 % from the fastest with 131072 (142.0 us), where
# splitting for 4 programs an SM took 46.5 and 149.6 us. With a short cache (batch 1, 4096
# tokens: 32 programs) they would leave most SMs idle.
AUTO_SPLIT_TOKENS = 1024


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, po_ptr, plse_ptr, out_ptr, count_ptr, kv_len, tokens_per_split, n_splits,
    scale_log2,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    HKV: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
    BLOCK_N: tl.constexpr, USE_DOT: tl.constexpr, PDL: tl.constexpr, FOLD: tl.constexpr,
    BLOCK_S: tl.constexpr, EARLY: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr,
    GROUP_AT_ONCE: tl.constexpr,
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
    if PREFETCH:
        lines = tl.arange(0, D // LINE) * LINE  # a row's 128-byte lines
        for n0 in range(start, end, BLOCK_N):
            rows = tl.minimum(n0 + tl.arange(0, BLOCK_N), end - 1).to(tl.int64)[:, None]
            _prefetch_l2(k_base + rows * stride_kn + lines[None, :])
            _prefetch_l2(v_base + rows * stride_vn + lines[None, :])
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
        m_i, alpha, p, l_i = _scores(q, k0, ok0, m_i, l_i, scale_log2, USE_DOT)
        acc = _values(p, v0, alpha, acc, USE_DOT)
        first = start + BLOCK_N
    for n0 in range(first, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < end
        rows = offs.to(tl.int64)[:, None]
        k = tl.load(k_base + rows * stride_kn + d[None, :], mask=ok[:, None], other=0.0)
        m_i, alpha, p, l_i = _scores(q, k, ok, m_i, l_i, scale_log2, USE_DOT)
        v = tl.load(v_base + rows * stride_vn + d[None, :], mask=ok[:, None], other=0.0)
        acc = _values(p, v, alpha, acc, USE_DOT)
    head = (b * HKV + h) * GROUP + g
    out = acc / l_i[:, None]
    part = head.to(tl.int64) * n_splits + pid_s
    tl.store(po_ptr + part[:, None] * D + d[None, :], out, mask=g_ok[:, None])
    tl.store(plse_ptr + part, m_i + tl.log2(l_i), mask=g_ok)
    if FOLD:
        # The barrier puts every thread's partial stores before the count, whose release
        # publishes them at GPU scope; the last program's count acquires all the others'.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_bh, 1, sem="acq_rel", scope="gpu")
        if arrived == n_splits - 1:
            tl.store(count_ptr + pid_bh, 0)  # every split has counted: ready for the next call
            if GROUP_AT_ONCE:
                _merge_group(
                    po_ptr, plse_ptr, out_ptr, (b * HKV + h) * GROUP, n_splits, GROUP, D, BLOCK_S
                )
            else:
                for i in tl.static_range(GROUP):
                    _merge_head(
                        po_ptr, plse_ptr, out_ptr, (b * HKV + h) * GROUP + i, n_splits, D, BLOCK_S
                    )


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the line of each address (a hint: nothing is read into the program)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _scores(q, k, ok, m_i, l_i, scale_log2, USE_DOT: tl.constexpr):
    """One tile of keys (rows past `ok` masked off) into the online softmax: the new running
    max, the rescale of what came before, the tile's weights and the new running sum."""
    if USE_DOT:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
    s = tl.where(ok[None, :], s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _values(p, v, alpha, acc, USE_DOT: tl.constexpr):
    """The tile's values, weighted by p, into the rescaled accumulator."""
    if USE_DOT:
        return tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)


@triton.jit
def _merge_head(po_ptr, plse_ptr, out_ptr, head, n_splits, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Writes query head `head`'s output: its splits' partial outputs weighted by
    2^(lse - max lse), over the sum of the weights."""
    head = head.to(tl.int64)
    d = tl.arange(0, D)
    lse_base = plse_ptr + head * n_splits
    if n_splits <= BLOCK_S:
        # one block holds every split: the weights and the partials are loaded together, in
        # one round trip, not one for the max and a second for the rest
        offs = tl.arange(0, BLOCK_S)
        ok = offs < n_splits
        lse = tl.load(lse_base + offs, mask=ok, other=float("-inf"))
        o = tl.load(po_ptr + (head * n_splits + offs)[:, None] * D + d[None, :], mask=ok[:, None])
        w = tl.exp2(lse - tl.max(lse, axis=0))
        acc = tl.sum(tl.where(ok[:, None], w[:, None] * o, 0.0), axis=0)
        tl.store(out_ptr + head * D + d, (acc / tl.sum(w, axis=0)).to(out_ptr.dtype.element_ty))
        return
    m = tl.max(tl.full((BLOCK_S,), float("-inf"), dtype=tl.float32), axis=0)
    for s0 in range(0, n_splits, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        lse = tl.load(lse_base + offs, mask=offs < n_splits, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, axis=0))
    acc = tl.zeros((D,), dtype=tl.float32)
    den = tl.zeros((BLOCK_S,), dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        ok = offs < n_splits
        w = tl.exp2(tl.load(lse_base + offs, mask=ok, other=float("-inf")) - m)
        o = tl.load(po_ptr + (head * n_splits + offs)[:, None] * D + d[None, :], mask=ok[:, None])
        acc += tl.sum(tl.where(ok[:, None], w[:, None] * o, 0.0), axis=0)
        den += w
    tl.store(out_ptr + head * D + d, (acc / tl.sum(den, axis=0)).to(out_ptr.dtype.element_ty))


@triton.jit
def _merge_group(
    po_ptr, plse_ptr, out_ptr, first_head, n_splits, GROUP: tl.constexpr, D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Writes the outputs of query heads first_head .. first_head + GROUP - 1 as _merge_head
    does, all at once (one round trip for every weight and partial): n_splits <= BLOCK_S."""
    g = tl.arange(0, GROUP)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    part = (first_head + g).to(tl.int64)[:, None] * n_splits + sp[None, :]  # (GROUP, BLOCK_S)
    ok = sp[None, :] < n_splits
    lse = tl.load(plse_ptr + part, mask=ok, other=float("-inf"))
    o = tl.load(po_ptr + part[:, :, None] * D + d[None, None, :], mask=ok[:, :, None], other=0.0)
    w = tl.exp2(lse - tl.max(lse, axis=1)[:, None])
    acc = tl.sum(w[:, :, None] * o, axis=1)
    heads = (first_head + g).to(tl.int64)
    out = acc / tl.sum(w, axis=1)[:, None]
    tl.store(out_ptr + heads[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty))


@triton.jit
def _merge_kernel(
    po_ptr, plse_ptr, out_ptr, n_splits, D: tl.constexpr, BLOCK_S: tl.constexpr,
    PDL: tl.constexpr, EARLY_DEPENDENTS: tl.constexpr,
):  # fmt: skip
    if PDL:
        if EARLY_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
        if not EARLY_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
    _merge_head(po_ptr, plse_ptr, out_ptr, tl.program_id(0), n_splits, D, BLOCK_S)


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def auto_split_tokens(
    sequences: int, kv_len: int, block_n: int, sms: int, programs_per_sm: int
) -> int:
    """Tokens a split for `sequences` (batch x KV heads) caches of `kv_len`: AUTO_SPLIT_TOKENS
    where that gives at least one program an SM, else enough splits for `programs_per_sm`."""
    if sequences * triton.cdiv(kv_len, AUTO_SPLIT_TOKENS) >= sms:
        return AUTO_SPLIT_TOKENS
    blocks = triton.cdiv(kv_len, block_n)
    want = max(1, triton.cdiv(programs_per_sm * sms, sequences))
    return triton.cdiv(blocks, min(want, blocks)) * block_n


# The fold's arrival counts, per device: zero between calls (the last program of a KV head resets
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


def kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_n: int = 64,
    split_tokens: int = 0,
    programs_per_sm: int = 4,
    num_warps: int = 4,
    num_stages: int = 4,
    use_dot: bool = True,
    merge: str = "kernel",
    early_history: bool = False,
    prefetch_l2: bool = False,
    early_dependents: bool = False,
) -> torch.Tensor:
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, not {merge!r}")
    b, hq, d = q.shape
    _, hkv, kv_len, _ = k_cache.shape
    if kv_len == 0:
        raise ValueError("the cache is empty: attention needs at least one cached token")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous dimension")
    group = hq // hkv
    if split_tokens <= 0:
        split_tokens = auto_split_tokens(
            b * hkv, kv_len, block_n, _sm_count(q.device), programs_per_sm
        )
    split_tokens = triton.cdiv(split_tokens, block_n) * block_n
    n_splits = triton.cdiv(kv_len, split_tokens)
    part_o = torch.empty((b * hq * n_splits, d), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((b * hq * n_splits,), device=q.device, dtype=torch.float32)
    pdl = _pdl(q.device)
    out = torch.empty((b, hq, d), device=q.device, dtype=q.dtype)
    block_s = min(64, triton.next_power_of_2(n_splits))
    fold = merge == "fold"
    # The fold merges with the split kernel's warps: at most 64 partial values a thread.
    fold_block_s = max(1, min(block_s, 2048 * num_warps // d)) if fold else 1
    # or all the group's heads at once, where one block holds every split and a power-of-two
    # group's partials come to at most 64 values a thread
    group_at_once = fold and n_splits <= block_s and group & (group - 1) == 0
    group_at_once = group_at_once and group * block_s * d <= 2048 * num_warps
    _split_kernel[(b * hkv, n_splits)](
        q, k_cache, v_cache, part_o, part_lse, out if fold else None,
        _arrival_counts(b * hkv, q.device) if fold else None, kv_len, split_tokens, n_splits,
        LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HKV=hkv, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=d,
        BLOCK_N=block_n, USE_DOT=use_dot, PDL=pdl, FOLD=fold, BLOCK_S=fold_block_s,
        EARLY=bool(early_history), PREFETCH=bool(prefetch_l2) and q.device.type == "cuda",
        LINE=max(1, min(d, 128 // k_cache.element_size())), GROUP_AT_ONCE=group_at_once,
        num_warps=num_warps,
        num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    if not fold:
        _merge_kernel[(b * hq,)](
            part_o, part_lse, out, n_splits, D=d, BLOCK_S=block_s, PDL=pdl,
            EARLY_DEPENDENTS=bool(early_dependents), num_warps=4, launch_pdl=pdl,
        )  # fmt: skip
    return out

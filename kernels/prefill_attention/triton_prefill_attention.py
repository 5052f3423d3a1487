"""Causal prefill attention in Triton (flash attention forward): a program owns block_m query
rows of one head, streams the visible keys in block_n tiles with an online softmax in fp32
(exp2, scale folded in), and masks only the tiles that cross the diagonal. Query blocks are
launched heaviest first (the last rows see the most keys), which evens out the tail of the grid.
Bottom-right aligned mask, so a chunk of queries at the end of a longer cache works the same.

`loads="descriptor"` (the default) moves Q, K, V and O through host-built tensor descriptors
(TMA on sm_90: the copy engine fetches each tile, no address arithmetic in the threads);
`loads="pointer"` also takes layouts TMA cannot address. `max_registers` caps the registers a
thread may take (0: Triton's choice): at 128, two 8-warp programs whose shared memory fits
twice (128x64 tiles at 2 stages, 98 KB) share an SM, but ptxas then serialises every wgmma to
fit them (scripts/prefill_sm90_schedule.py), and it tied the defaults on the H200. 256-row
tiles over 16 warps stay in the search space though they lost at 16k
(docs/benchmarks/2026-11-30-h200-session15.md and -session16.md)."""

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LANGUAGE = "triton"
PARAMS = {
    "block_m": [16, 32, 64, 128, 256],
    "block_n": [16, 32, 64, 128],
    "num_warps": [2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "loads": ["pointer", "descriptor"],
    "max_registers": [0, 128],
}
LOADS = tuple(PARAMS["loads"])

LOG2E = 1.4426950408889634


@triton.jit
def _load_rows(ptr, desc, b, h, stride_n, r0, length, BLOCK: tl.constexpr, D: tl.constexpr,
               DESC: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    if DESC:
        # Rows past the tensor's length (the descriptor's shape) come back as zeros.
        return desc.load([b, h, r0, 0]).reshape(BLOCK, D)
    else:
        rn = r0 + tl.arange(0, BLOCK)
        rd = tl.arange(0, D)
        if MASK:
            ok = rn < length
            return tl.load(ptr + rn[:, None] * stride_n + rd[None, :], mask=ok[:, None], other=0.0)
        else:
            return tl.load(ptr + rn[:, None] * stride_n + rd[None, :])


@triton.jit
def _tile(
    acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, b, h, stride_kn, stride_vn, rm, n0, offset,
    kv_len, scale_log2,
    D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, DESC: tl.constexpr,
):  # fmt: skip
    k = _load_rows(k_base, k_desc, b, h, stride_kn, n0, kv_len, BLOCK_N, D, DESC, MASK)
    qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    if MASK:
        rn = n0 + tl.arange(0, BLOCK_N)
        visible = (rn[None, :] <= rm[:, None] + offset) & (rn[None, :] < kv_len)
        s = tl.where(visible, qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
    else:
        # The scale multiplies the row maxima only; the tile takes one fused multiply-add.
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale_log2)
        p = tl.exp2(qk * scale_log2 - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _load_rows(v_base, v_desc, b, h, stride_vn, n0, kv_len, BLOCK_N, D, DESC, MASK)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return acc, l_i, m_new


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, q_desc, k_desc, v_desc, o_desc, q_len, kv_len, scale_log2,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DESC: tl.constexpr,
):  # fmt: skip
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offset = kv_len - q_len
    m0 = pid_m * BLOCK_M
    rm = m0 + tl.arange(0, BLOCK_M)
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    q = _load_rows(q_base, q_desc, b, h, stride_qm, m0, q_len, BLOCK_M, D, DESC, True)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    # Tiles every row of the block sees in full, then the tiles crossing the diagonal.
    full_end = (offset + m0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(offset + m0 + BLOCK_M, kv_len)
    for n0 in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _tile(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, b, h, stride_kn, stride_vn, rm, n0,
            offset, kv_len, scale_log2, D, BLOCK_N, False, DESC,
        )  # fmt: skip
    for n0 in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _tile(
            acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, b, h, stride_kn, stride_vn, rm, n0,
            offset, kv_len, scale_log2, D, BLOCK_N, True, DESC,
        )  # fmt: skip
    out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if DESC:
        o_desc.store([b, h, m0, 0], out.reshape(1, 1, BLOCK_M, D))
    else:
        o_base = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
        rd = tl.arange(0, D)
        tl.store(o_base + rm[:, None] * stride_om + rd[None, :], out, mask=(rm < q_len)[:, None])


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A (batch, heads, length, head_dim) descriptor whose tiles are `rows` x head_dim; a
    ValueError naming what TMA cannot address (16-byte aligned base, strides and rows; at most
    256 columns a tile)."""
    size = t.element_size()
    problems = [f"base address {t.data_ptr():#x}"] if t.data_ptr() % 16 else []
    problems += [
        f"{dim} stride {stride * size} bytes"
        for dim, stride in zip(("batch", "head", "row"), t.stride()[:3], strict=True)
        if stride * size % 16
    ]
    if t.shape[3] * size % 16 or t.shape[3] > 256:
        problems.append(f"head_dim {t.shape[3]} ({t.shape[3] * size} bytes a row)")
    if problems:
        raise ValueError(
            f"loads='descriptor' needs 16-byte aligned rows, strides and base and at most 256 "
            f"columns: {', '.join(problems)}; use loads='pointer'"
        )
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[3]])


def kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_m: int = 128,
    block_n: int = 128,
    num_warps: int = 8,
    num_stages: int = 3,
    loads: str = "descriptor",
    max_registers: int = 0,
) -> torch.Tensor:
    """Causal attention of q over k and v (bottom-right aligned), in q's dtype."""
    b, h, q_len, d = q.shape
    kv_len = k.shape[2]
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous dimension")
    if q_len > kv_len:
        raise ValueError(f"q_len {q_len} > kv_len {kv_len}")
    if loads not in LOADS:
        raise ValueError(f"loads={loads!r}: expected one of {LOADS}")
    o = torch.empty((b, h, q_len, d), device=q.device, dtype=q.dtype)
    if o.numel() == 0:
        return o  # no descriptor has an empty dimension
    desc = loads == "descriptor"
    descs = (
        [_descriptor(t, r) for t, r in ((q, block_m), (k, block_n), (v, block_n), (o, block_m))]
        if desc
        else [None] * 4
    )
    grid = (triton.cdiv(q_len, block_m), b * h)
    _attn_fwd[grid](
        q, k, v, o, *descs, q_len, kv_len, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        H=h, D=d, BLOCK_M=block_m, BLOCK_N=block_n, DESC=desc,
        num_warps=num_warps, num_stages=num_stages, maxnreg=max_registers or None,
    )  # fmt: skip
    return o

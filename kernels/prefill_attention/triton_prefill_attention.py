"""Causal prefill attention in Triton (flash attention forward): a program owns block_m query
rows of one head, streams the visible keys in block_n tiles with an online softmax in fp32
(exp2, scale folded in), and masks only the tiles that cross the diagonal. Query blocks are
launched heaviest first (the last rows see the most keys), which evens out the tail of the grid.
Bottom-right aligned mask, so a chunk of queries at the end of a longer cache works the same.

`loads="descriptor"` moves Q, K and V through host-built tensor descriptors (TMA on sm_90: the
copy engine fetches each tile, no address arithmetic in the threads). `max_registers` caps
the registers a thread may take (0: Triton's choice): at 128, two 8-warp programs share an SM,
so one's softmax can run while the other's products do."""

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
LOADS = ("pointer", "descriptor")

LOG2E = 1.4426950408889634


@triton.jit
def _load_rows(ptr, desc, b, h, stride_n, r0, length, BLOCK: tl.constexpr, D: tl.constexpr,
               DESC: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    if DESC:
        # Rows past `length` come back as zeros (the descriptor's bounds).
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
    rd = tl.arange(0, D)
    row_ok = rm < q_len
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
        tl.store(o_base + rm[:, None] * stride_om + rd[None, :], out, mask=row_ok[:, None])


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A (batch, heads, length, head_dim) descriptor whose tiles are `rows` x head_dim."""
    size = t.element_size()
    if t.data_ptr() % 16 or any(s * size % 16 for s in t.stride()[:3]):
        raise ValueError(
            "loads='descriptor' needs 16-byte aligned rows and base; use loads='pointer'"
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
):
    b, h, q_len, d = q.shape
    kv_len = k.shape[2]
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous dimension")
    if q_len > kv_len:
        raise ValueError(f"q_len {q_len} > kv_len {kv_len}")
    if loads not in LOADS:
        raise ValueError(f"loads={loads!r}: expected one of {LOADS}")
    o = torch.empty((b, h, q_len, d), device=q.device, dtype=q.dtype)
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

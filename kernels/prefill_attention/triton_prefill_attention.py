"""Causal prefill attention in Triton (flash attention forward): a program owns block_m query
rows of one head, streams the visible keys in block_n tiles with an online softmax in fp32
(exp2, scale folded in), and masks only the tiles that cross the diagonal. Query blocks are
launched heaviest first (the last rows see the most keys), which evens out the tail of the grid.
Bottom-right aligned mask, so a chunk of queries at the end of a longer cache works the same."""

import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_m": [16, 32, 64, 128],
    "block_n": [16, 32, 64, 128],
    "num_warps": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
}

LOG2E = 1.4426950408889634


@triton.jit
def _tile(
    acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, rm, n0, offset, kv_len, scale_log2,
    D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    rn = n0 + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    if MASK:
        ok = rn < kv_len
        k = tl.load(k_base + rn[:, None] * stride_kn + rd[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_base + rn[:, None] * stride_vn + rd[None, :], mask=ok[:, None], other=0.0)
    else:
        k = tl.load(k_base + rn[:, None] * stride_kn + rd[None, :])
        v = tl.load(v_base + rn[:, None] * stride_vn + rd[None, :])
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2
    if MASK:
        visible = (rn[None, :] <= rm[:, None] + offset) & (rn[None, :] < kv_len)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return acc, l_i, m_new


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, q_len, kv_len, scale_log2,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offset = kv_len - q_len
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, D)
    row_ok = rm < q_len
    q_base = q_ptr + b * stride_qb + h * stride_qh
    q = tl.load(q_base + rm[:, None] * stride_qm + rd[None, :], mask=row_ok[:, None], other=0.0)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    # Tiles every row of the block sees in full, then the tiles crossing the diagonal.
    full_end = (offset + pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
    hi = tl.minimum(offset + (pid_m + 1) * BLOCK_M, kv_len)
    for n0 in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _tile(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, rm, n0, offset, kv_len,
            scale_log2, D, BLOCK_N, False,
        )  # fmt: skip
    for n0 in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _tile(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, rm, n0, offset, kv_len,
            scale_log2, D, BLOCK_N, True,
        )  # fmt: skip
    out = acc / l_i[:, None]
    o_base = o_ptr + b * stride_ob + h * stride_oh
    tl.store(
        o_base + rm[:, None] * stride_om + rd[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_m: int = 128,
    block_n: int = 64,
    num_warps: int = 8,
    num_stages: int = 3,
):
    b, h, q_len, d = q.shape
    kv_len = k.shape[2]
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous dimension")
    if q_len > kv_len:
        raise ValueError(f"q_len {q_len} > kv_len {kv_len}")
    o = torch.empty((b, h, q_len, d), device=q.device, dtype=q.dtype)
    grid = (triton.cdiv(q_len, block_m), b * h)
    _attn_fwd[grid](
        q, k, v, o, q_len, kv_len, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        H=h, D=d, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return o

"""MLA's expanded prefill attention in Triton (flash attention forward, as the prefill_attention
task's Triton candidate): a program owns block_m query rows of one head, streams the visible
keys in block_n tiles with an online softmax in fp32 (exp2, scale folded in), and masks only the
tiles that cross the diagonal; query blocks are launched heaviest first. Bottom-right aligned
mask, so a chunk of queries at the end of a longer cache works the same.

q and k are wider than v (DeepSeek: 128 + 64 rope dims, v 128), so the scores are two products,
one over v's width (DV) and one over the rest (DR), each a power of two wide; the accumulator
and the output are DV wide. `loads="descriptor"` (the default) moves the tiles through
host-built tensor descriptors (TMA on sm_90), two over q and two over k (each part its own tile
width); `loads="pointer"` also takes layouts TMA cannot address. 192-wide K tiles take shared
memory: 128x128 tiles fit 2 stages (209 KiB on sm_90), 128x64 tiles 3 (169 KiB)
(scripts/prefill_sm90_schedule.py --mla)."""

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LANGUAGE = "triton"
# A decoder block passes q and v as head-transposed views of its projections (no copy): the
# descriptors and pointers take any strides with a contiguous head_dim.
STRIDED_INPUTS = True
PARAMS = {
    "block_m": [16, 32, 64, 128],
    "block_n": [16, 32, 64, 128],
    "num_warps": [2, 4, 8, 16],
    "num_stages": [1, 2, 3, 4],
    "loads": ["pointer", "descriptor"],
}
LOADS = tuple(PARAMS["loads"])

LOG2E = 1.4426950408889634


@triton.jit
def _load_rows(ptr, desc, b, h, stride_n, r0, length, BLOCK: tl.constexpr, D: tl.constexpr,
               COL: tl.constexpr, DESC: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    """Rows r0.. of columns COL..COL + D."""
    if DESC:
        # Rows past the tensor's length (the descriptor's shape) come back as zeros.
        return desc.load([b, h, r0, COL]).reshape(BLOCK, D)
    else:
        rn = (r0 + tl.arange(0, BLOCK)).to(tl.int64)  # a long cache's row offsets pass 2**31
        rd = COL + tl.arange(0, D)
        if MASK:
            ok = rn < length
            return tl.load(ptr + rn[:, None] * stride_n + rd[None, :], mask=ok[:, None], other=0.0)
        else:
            return tl.load(ptr + rn[:, None] * stride_n + rd[None, :])


@triton.jit
def _tile(
    acc, l_i, m_i, q, qr, k_base, v_base, k_desc, kr_desc, v_desc, b, h, stride_kn, stride_vn, rm,
    n0, offset, kv_len, scale_log2,
    DV: tl.constexpr, DR: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
    DESC: tl.constexpr,
):  # fmt: skip
    k = _load_rows(k_base, k_desc, b, h, stride_kn, n0, kv_len, BLOCK_N, DV, 0, DESC, MASK)
    qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    kr = _load_rows(k_base, kr_desc, b, h, stride_kn, n0, kv_len, BLOCK_N, DR, DV, DESC, MASK)
    qk = tl.dot(qr, tl.trans(kr), qk, input_precision="ieee")
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
    v = _load_rows(v_base, v_desc, b, h, stride_vn, n0, kv_len, BLOCK_N, DV, 0, DESC, MASK)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return acc, l_i, m_new


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, q_desc, k_desc, v_desc, o_desc, qr_desc, kr_desc, q_len, kv_len,
    scale_log2, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    H: tl.constexpr, DV: tl.constexpr, DR: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DESC: tl.constexpr,
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
    q = _load_rows(q_base, q_desc, b, h, stride_qm, m0, q_len, BLOCK_M, DV, 0, DESC, True)
    qr = _load_rows(q_base, qr_desc, b, h, stride_qm, m0, q_len, BLOCK_M, DR, DV, DESC, True)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, DV), dtype=tl.float32)
    # Tiles every row of the block sees in full, then the tiles crossing the diagonal.
    full_end = (offset + m0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(offset + m0 + BLOCK_M, kv_len)
    for n0 in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _tile(
            acc, l_i, m_i, q, qr, k_base, v_base, k_desc, kr_desc, v_desc, b, h, stride_kn,
            stride_vn, rm, n0, offset, kv_len, scale_log2, DV, DR, BLOCK_N, False, DESC,
        )  # fmt: skip
    for n0 in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _tile(
            acc, l_i, m_i, q, qr, k_base, v_base, k_desc, kr_desc, v_desc, b, h, stride_kn,
            stride_vn, rm, n0, offset, kv_len, scale_log2, DV, DR, BLOCK_N, True, DESC,
        )  # fmt: skip
    out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if DESC:
        o_desc.store([b, h, m0, 0], out.reshape(1, 1, BLOCK_M, DV))
    else:
        o_base = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
        rd = tl.arange(0, DV)
        tl.store(
            o_base + rm.to(tl.int64)[:, None] * stride_om + rd[None, :],
            out,
            mask=(rm < q_len)[:, None],
        )


def _descriptor(t: torch.Tensor, rows: int, cols: int | None = None) -> TensorDescriptor:
    """A (batch, heads, length, head_dim) descriptor whose tiles are `rows` x `cols` (default
    head_dim); a ValueError naming what TMA cannot address (16-byte aligned base, strides and
    rows; at most 256 columns a tile)."""
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
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols or t.shape[3]])


def _power_of_two(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_m: int = 128,
    block_n: int = 64,
    num_warps: int = 8,
    num_stages: int = 3,
    loads: str = "descriptor",
) -> torch.Tensor:
    """Causal attention of q over k and v (bottom-right aligned), v narrower, in q's dtype.
    The defaults fit sm_90's shared memory at 192-wide q and k (169 KiB)."""
    b, h, q_len, d = q.shape
    kv_len, dv = k.shape[2], v.shape[3]
    dr = d - dv
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("head_dim must be the contiguous dimension")
    if k.shape[3] != d or not (_power_of_two(dv) and _power_of_two(dr)):
        raise ValueError(
            f"q's and k's head_dim ({d}, {k.shape[3]}) must match, and a narrower v's ({dv}) "
            f"and the rest of q's ({dr}) each be a power of two of at least 16"
        )
    if q_len > kv_len:
        raise ValueError(f"q_len {q_len} > kv_len {kv_len}")
    if loads not in LOADS:
        raise ValueError(f"loads={loads!r}: expected one of {LOADS}")
    o = torch.empty((b, h, q_len, dv), device=q.device, dtype=q.dtype)
    if o.numel() == 0:
        return o  # no descriptor has an empty dimension
    desc = loads == "descriptor"
    tiles = [(q, block_m, dv), (k, block_n, dv), (v, block_n, dv), (o, block_m, dv)]
    tiles += [(q, block_m, dr), (k, block_n, dr)]
    descs = [_descriptor(*tile) for tile in tiles] if desc else [None] * 6
    grid = (triton.cdiv(q_len, block_m), b * h)
    _attn_fwd[grid](
        q, k, v, o, *descs, q_len, kv_len, LOG2E / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        H=h, DV=dv, DR=dr, BLOCK_M=block_m, BLOCK_N=block_n, DESC=desc,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return o

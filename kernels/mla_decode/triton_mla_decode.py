"""MLA decode in Triton, flash-decoding style: the latent cache is cut into splits along its
length; a program takes block_h heads and one split, loads each latent tile once and uses it as
both key (with the rope part) and value, with an online softmax in fp32; a second kernel merges
the splits by their log-sum-exp. Head blocks vary fastest in the grid, so the programs reading
the same cache tile run together and share it through L2.

On Hopper and later both kernels are launched with programmatic dependent launch: each waits
(`gdc_wait`) for the kernel before it before it reads anything, then lets the kernel after it
launch, so the merge's launch passes while the split kernel runs. Where one block holds every
split and their partials come to at most 64 values a thread, the merge loads the weights and the
partials in one round trip.

`tokens_as_rows` True computes the transposed products: scores as (tokens, heads) = latent tile
x queries^T and the output as (rank, heads) = latent tile^T x weights. The latent tile is then
the first operand of both and the queries the second, which Hopper's wgmma reads from shared
memory, so the registers hold the (rank, heads) accumulator and little else; with heads as rows,
the queries (block_h x 512) are the first operand and sm_90 builds spill registers at every
wgmma-sized block (200 bytes a thread at the defaults in a build for sm_90 with Triton 3.9, made
without a GPU by scripts/mla_sm90_resources.py)."""

import functools
import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_h": [16, 32, 64],
    "block_n": [16, 32, 64, 128],
    "split_tokens": [0, 32, 256, 512, 1024, 2048, 4096],
    "programs_per_sm": [1, 2, 4, 8],
    "num_warps": [2, 4, 8],
    "num_stages": [1, 2, 3, 4],
    "tokens_as_rows": [False, True],
}

LOG2E = 1.4426950408889634
SCALE_DIM = 192
MERGE_WARPS = 4


@triton.jit
def _split_kernel(
    qn_ptr, qp_ptr, c_ptr, p_ptr, po_ptr, plse_ptr, H, kv_len, tokens_per_split, n_splits,
    scale_log2, stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_cb, stride_cn,
    stride_pb, stride_pn,
    R: tl.constexpr, P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr, TOKENS_AS_ROWS: tl.constexpr,
):  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    head_blocks = tl.cdiv(H, BLOCK_H)
    b = tl.program_id(0) // head_blocks
    hb = tl.program_id(0) % head_blocks
    pid_s = tl.program_id(1)
    rh = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = rh < H
    rr = tl.arange(0, R)
    rp = tl.arange(0, P)
    b64 = b.to(tl.int64)
    qn = tl.load(
        qn_ptr + b64 * stride_qnb + rh[:, None] * stride_qnh + rr[None, :],
        mask=h_ok[:, None],
        other=0.0,
    )
    qp = tl.load(
        qp_ptr + b64 * stride_qpb + rh[:, None] * stride_qph + rp[None, :],
        mask=h_ok[:, None],
        other=0.0,
    )
    c_base = c_ptr + b64 * stride_cb
    p_base = p_ptr + b64 * stride_pb
    start = pid_s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, kv_len)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    if TOKENS_AS_ROWS:
        acc_t = tl.zeros((R, BLOCK_H), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_H, R), dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        ok = offs < end
        rows = offs.to(tl.int64)[:, None]
        c = tl.load(c_base + rows * stride_cn + rr[None, :], mask=ok[:, None], other=0.0)
        kp = tl.load(p_base + rows * stride_pn + rp[None, :], mask=ok[:, None], other=0.0)
        if TOKENS_AS_ROWS:
            # scores and weights as (tokens, heads), the output as (rank, heads): the latent tile
            # is the first operand of both products and the queries the second, so both stay in
            # shared memory and only the (rank, heads) accumulator lives in registers
            s = tl.dot(c, tl.trans(qn), input_precision="ieee")
            s = tl.dot(kp, tl.trans(qp), s, input_precision="ieee")
            s = tl.where(ok[:, None], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp2(m_i - m_new)
            prob = tl.exp2(s - m_new[None, :])
            l_i = l_i * alpha + tl.sum(prob, axis=0)
            acc_t = tl.dot(
                tl.trans(c), prob.to(c.dtype), acc_t * alpha[None, :], input_precision="ieee"
            )
        else:
            s = tl.dot(qn, tl.trans(c), input_precision="ieee")
            s = tl.dot(qp, tl.trans(kp), s, input_precision="ieee")
            s = tl.where(ok[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            prob = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(prob, axis=1)
            acc = tl.dot(prob.to(c.dtype), c, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    if TOKENS_AS_ROWS:
        acc = tl.trans(acc_t)
    part = (b64 * H + rh) * n_splits + pid_s
    tl.store(po_ptr + part[:, None] * R + rr[None, :], acc / l_i[:, None], mask=h_ok[:, None])
    tl.store(plse_ptr + part, m_i + tl.log2(l_i), mask=h_ok)


@triton.jit
def _merge_kernel(
    po_ptr, plse_ptr, out_ptr, n_splits, R: tl.constexpr, BLOCK_S: tl.constexpr,
    ONE_PASS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    head = tl.program_id(0).to(tl.int64)
    rr = tl.arange(0, R)
    lse_base = plse_ptr + head * n_splits
    if ONE_PASS:  # n_splits <= BLOCK_S
        offs = tl.arange(0, BLOCK_S)
        ok = offs < n_splits
        lse = tl.load(lse_base + offs, mask=ok, other=float("-inf"))
        o = tl.load(po_ptr + (head * n_splits + offs)[:, None] * R + rr[None, :], mask=ok[:, None])
        w = tl.exp2(lse - tl.max(lse, axis=0))
        acc = tl.sum(tl.where(ok[:, None], w[:, None] * o, 0.0), axis=0)
        tl.store(out_ptr + head * R + rr, (acc / tl.sum(w, axis=0)).to(out_ptr.dtype.element_ty))
        return
    m = tl.max(tl.full((BLOCK_S,), float("-inf"), dtype=tl.float32), axis=0)
    for s0 in range(0, n_splits, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        m = tl.maximum(
            m, tl.max(tl.load(lse_base + offs, mask=offs < n_splits, other=float("-inf")), axis=0)
        )
    acc = tl.zeros((R,), dtype=tl.float32)
    den = tl.zeros((BLOCK_S,), dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        ok = offs < n_splits
        w = tl.exp2(tl.load(lse_base + offs, mask=ok, other=float("-inf")) - m)
        o = tl.load(po_ptr + (head * n_splits + offs)[:, None] * R + rr[None, :], mask=ok[:, None])
        acc += tl.sum(tl.where(ok[:, None], w[:, None] * o, 0.0), axis=0)
        den += w
    tl.store(out_ptr + head * R + rr, (acc / tl.sum(den, axis=0)).to(out_ptr.dtype.element_ty))


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_count(programs: int, blocks: int, sms: int, programs_per_sm: int) -> int:
    """Splits per (sequence, head block) so that all programs run in one wave of
    `programs_per_sm` per SM: the split kernel is compute-bound, and a second, part-filled wave
    costs as much as the first (at 132 SMs, 16 sequences x 2 head blocks: 4 splits, 128
    programs; rounding up to 5 splits gives 160 programs, a second wave of 28)."""
    return max(1, min(blocks, programs_per_sm * sms // programs))


def kernel(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    block_h: int = 64,
    block_n: int = 64,
    split_tokens: int = 0,
    programs_per_sm: int = 1,
    num_warps: int = 8,
    num_stages: int = 2,
    tokens_as_rows: bool = False,
):
    b, h, r = q_nope.shape
    p = q_pe.shape[2]
    kv_len = ckv.shape[1]
    if kv_len == 0:
        raise ValueError("the cache is empty: attention needs at least one cached token")
    if any(t.stride(-1) != 1 for t in (q_nope, q_pe, ckv, kpe)):
        raise ValueError("the last dimension must be contiguous")
    if b * h == 0:
        return torch.empty((b, h, r), device=q_nope.device, dtype=q_nope.dtype)
    head_blocks = triton.cdiv(h, block_h)
    blocks = triton.cdiv(kv_len, block_n)
    if split_tokens <= 0:
        want = split_count(b * head_blocks, blocks, _sm_count(q_nope.device), programs_per_sm)
        split_tokens = triton.cdiv(blocks, want) * block_n
    split_tokens = triton.cdiv(split_tokens, block_n) * block_n
    n_splits = triton.cdiv(kv_len, split_tokens)
    pdl = _pdl(q_nope.device)
    part_o = torch.empty((b * h * n_splits, r), device=q_nope.device, dtype=torch.float32)
    part_lse = torch.empty((b * h * n_splits,), device=q_nope.device, dtype=torch.float32)
    _split_kernel[(b * head_blocks, n_splits)](
        q_nope, q_pe, ckv, kpe, part_o, part_lse, h, kv_len, split_tokens, n_splits,
        LOG2E / math.sqrt(SCALE_DIM),
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        ckv.stride(0), ckv.stride(1), kpe.stride(0), kpe.stride(1),
        R=r, P=p, BLOCK_H=block_h, BLOCK_N=block_n, PDL=pdl,
        TOKENS_AS_ROWS=bool(tokens_as_rows), num_warps=num_warps,
        num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    out = torch.empty((b, h, r), device=q_nope.device, dtype=q_nope.dtype)
    block_s = min(64, triton.next_power_of_2(n_splits))
    one_pass = n_splits <= block_s and block_s * r <= 64 * 32 * MERGE_WARPS
    _merge_kernel[(b * h,)](
        part_o, part_lse, out, n_splits, R=r, BLOCK_S=block_s, ONE_PASS=one_pass, PDL=pdl,
        num_warps=MERGE_WARPS, launch_pdl=pdl,
    )  # fmt: skip
    return out

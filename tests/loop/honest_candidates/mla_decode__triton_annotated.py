"""MLA decode in Triton (absorbed form): scores = q_nope . ckv + q_pe . kpe scaled by
1/sqrt(192), output = softmax(scores) @ ckv. One program per (batch, block of heads), online
softmax over the latent cache in BLOCK_N tiles."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"block_h": [16, 32], "block_n": [32, 64], "num_warps": [4, 8]}
SCALE_DIM = 192


@triton.jit
def _mla_decode(
    qn_ptr,
    qp_ptr,
    ckv_ptr,
    kpe_ptr,
    o_ptr,
    H,
    N,
    sm_scale,
    sqn_b,
    sqn_h,
    sqp_b,
    sqp_h,
    sc_b,
    sc_n,
    sk_b,
    sk_n,
    so_b,
    so_h,
    R: tl.constexpr,
    P: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    r = tl.arange(0, R)
    p = tl.arange(0, P)
    qn = tl.load(
        qn_ptr + b * sqn_b + h[:, None] * sqn_h + r[None, :], mask=hmask[:, None], other=0.0
    )
    qp = tl.load(
        qp_ptr + b * sqp_b + h[:, None] * sqp_h + p[None, :], mask=hmask[:, None], other=0.0
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, R], tl.float32)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < N
        c = tl.load(
            ckv_ptr + b * sc_b + n[:, None] * sc_n + r[None, :], mask=nmask[:, None], other=0.0
        )
        kp = tl.load(
            kpe_ptr + b * sk_b + n[:, None] * sk_n + p[None, :], mask=nmask[:, None], other=0.0
        )
        s = (tl.dot(qn, tl.trans(c)) + tl.dot(qp, tl.trans(kp))) * sm_scale
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        acc = acc * alpha[:, None] + tl.dot(pr.to(c.dtype), c)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + b * so_b + h[:, None] * so_h + r[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=hmask[:, None],
    )


def _grid(b: int, h: int, block_h: int) -> tuple[int, int]:
    return (b, triton.cdiv(h, block_h))


def kernel(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    block_h: int = 16,
    block_n: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    b, h, r = q_nope.shape
    p = q_pe.shape[-1]
    n = ckv.shape[1]
    o = q_nope.new_empty((b, h, r))
    _mla_decode[_grid(b, h, block_h)](
        q_nope, q_pe, ckv, kpe, o, h, n, 1.0 / math.sqrt(SCALE_DIM),
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1),
        ckv.stride(0), ckv.stride(1), kpe.stride(0), kpe.stride(1), o.stride(0), o.stride(1),
        R=r, P=p, BLOCK_H=block_h, BLOCK_N=block_n, num_warps=num_warps,
    )  # fmt: skip
    return o

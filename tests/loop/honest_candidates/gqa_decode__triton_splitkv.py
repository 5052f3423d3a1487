"""GQA decode (flash-decoding) in Triton: the KV sequence split across programs; each program
handles one (batch, kv head, split), all the kv head's query heads at once with tl.dot, and
writes a partial (acc, max, sum); a second kernel merges the splits. Scratch buffers cached per
shape in a module dict."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"block_n": [32, 64], "splits": [8, 16, 32], "num_warps": [4]}

_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


@triton.jit
def _decode_split(
    q_ptr,
    k_ptr,
    v_ptr,
    acc_ptr,
    ml_ptr,
    N,
    sm_scale,
    sqb,
    sqh,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    gmask = g < G
    q = tl.load(
        q_ptr + b * sqb + (hk * G + g)[:, None] * sqh + d[None, :], mask=gmask[:, None], other=0.0
    )
    per = tl.cdiv(N, SPLITS)
    lo = sp * per
    hi = tl.minimum(lo + per, N)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < hi
        k = tl.load(
            k_ptr + b * skb + hk * skh + n[:, None] * skn + d[None, :],
            mask=nmask[:, None],
            other=0.0,
        )
        v = tl.load(
            v_ptr + b * svb + hk * svh + n[:, None] * svn + d[None, :],
            mask=nmask[:, None],
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    row = (b * tl.num_programs(1) + hk) * SPLITS + sp
    tl.store(acc_ptr + (row * G_PAD + g)[:, None] * D + d[None, :], acc)
    tl.store(ml_ptr + (row * G_PAD + g) * 2, m_i)
    tl.store(ml_ptr + (row * G_PAD + g) * 2 + 1, l_i)


@triton.jit
def _merge(
    acc_ptr,
    ml_ptr,
    o_ptr,
    sob,
    soh,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    SPLITS: tl.constexpr,
    HK: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    gi = tl.program_id(2)
    d = tl.arange(0, D)
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([D], tl.float32)
    for sp in range(SPLITS):
        row = ((b * HK + hk) * SPLITS + sp) * G_PAD + gi
        m_s = tl.load(ml_ptr + row * 2)
        l_s = tl.load(ml_ptr + row * 2 + 1)
        a_s = tl.load(acc_ptr + row * D + d)
        m_new = tl.maximum(m, m_s)
        c_old = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_new))
        c_new = tl.where(m_s == float("-inf"), 0.0, tl.math.exp2(m_s - m_new))
        acc = acc * c_old + a_s * c_new
        l = l * c_old + l_s * c_new
        m = m_new
    tl.store(o_ptr + b * sob + (hk * G + gi) * soh + d, (acc / l).to(o_ptr.dtype.element_ty))


def _scratch(
    b: int, hk: int, splits: int, g_pad: int, d: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    key = (b, hk, splits, g_pad, d, device)
    if key not in _SCRATCH:
        _SCRATCH[key] = (
            torch.empty((b * hk * splits * g_pad, d), device=device, dtype=torch.float32),
            torch.empty((b * hk * splits * g_pad, 2), device=device, dtype=torch.float32),
        )
    return _SCRATCH[key]


def kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_n: int = 64,
    splits: int = 16,
    num_warps: int = 4,
) -> torch.Tensor:
    b, hq, d = q.shape
    hk, n = k_cache.shape[1], k_cache.shape[2]
    g = hq // hk
    g_pad = max(16, triton.next_power_of_2(g))
    splits = max(1, min(splits, triton.cdiv(n, block_n)))
    acc, ml = _scratch(b, hk, splits, g_pad, d, q.device)
    out = torch.empty_like(q)
    _decode_split[(b, hk, splits)](
        q, k_cache, v_cache, acc, ml, n, 1.0 / math.sqrt(d),
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        G=g, G_PAD=g_pad, D=d, BLOCK_N=block_n, SPLITS=splits, num_warps=num_warps,
    )  # fmt: skip
    _merge[(b, hk, g)](
        acc, ml, out, out.stride(0), out.stride(1), G=g, G_PAD=g_pad, D=d, SPLITS=splits, HK=hk
    )
    return out

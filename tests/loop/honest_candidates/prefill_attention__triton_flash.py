"""Causal prefill attention (FlashAttention-2 forward) in Triton: one program per (query block,
batch*head); K/V walked in BLOCK_N tiles up to the causal edge (bottom-right aligned: query row
i sees keys up to i + kv_len - q_len). Autotuned over tile sizes, configs pruned by head_dim."""

import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {}


def _keep(configs, named_args, **kwargs):
    d = named_args["HEAD_DIM"] if "HEAD_DIM" in named_args else kwargs.get("HEAD_DIM", 128)
    return [c for c in configs if not (d > 128 and c.kwargs["BLOCK_N"] > 64)] or configs


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm in (64, 128)
        for bn in (32, 64)
        for w in (4, 8)
        for s in (2, 3)
    ],
    key=["Q_LEN", "KV_LEN", "HEAD_DIM"],
    prune_configs_by={"early_config_prune": _keep},
)
@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    O,
    sm_scale,
    Q_LEN,
    KV_LEN,
    H,
    sqb,
    sqh,
    sqm,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    sob,
    soh,
    som,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    tl.static_assert(HEAD_DIM <= 256)
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
        mask=offs_m[:, None] < Q_LEN,
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offset = KV_LEN - Q_LEN
    qk_scale = sm_scale * 1.44269504
    hi = tl.minimum(KV_LEN, offset + (start_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(
            K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :],
            mask=offs_n[:, None] < KV_LEN,
            other=0.0,
        )
        v = tl.load(
            V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :],
            mask=offs_n[:, None] < KV_LEN,
            other=0.0,
        )
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        causal = (offs_n[None, :] <= offs_m[:, None] + offset) & (offs_n[None, :] < KV_LEN)
        qk = tl.where(causal, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(
        O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :],
        acc.to(O.dtype.element_ty),
        mask=offs_m[:, None] < Q_LEN,
    )


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    B, H, Q_LEN, D = q.shape
    KV_LEN = k.shape[2]
    o = torch.empty_like(q)
    grid = lambda META: (triton.cdiv(Q_LEN, META["BLOCK_M"]), B * H)  # noqa: E731
    _attn_fwd[grid](
        q, k, v, o, 1.0 / math.sqrt(D), Q_LEN, KV_LEN, H,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], HEAD_DIM=D,
    )  # fmt: skip
    return o

"""Skinny GEMM in Triton: W streamed once in (block_n x block_k) tiles, K split across programs.

Programs that share a weight tile are launched next to each other (the m-tiles vary fastest), so
for m > block_m the repeated reads of a tile come from L2. With split_k > 1, each split writes an
fp32 partial sum and a second kernel adds the splits in a fixed order (deterministic).
`use_dot` picks tensor cores (tl.dot, rows padded to 16) or a broadcast multiply-reduce.
"""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_m": [16, 32, 64],
    "block_n": [16, 32, 64, 128],
    "block_k": [32, 64, 128, 256, 512],
    "split_k": [1, 2, 4, 8, 16],
    "num_warps": [1, 2, 4, 8],
    "num_stages": [1, 2, 3, 4, 5, 6],
    "use_dot": [True, False],
}


@triton.jit
def _skinny_gemm(
    x_ptr, w_ptr, out_ptr, M, N, K, k_per_split,
    stride_xm, stride_wn, stride_om, stride_on, stride_os,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, USE_DOT: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    k_start = pid_s * k_per_split
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k_start + rk)[None, :]
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + (k_start + rk)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            if EVEN_N:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
            else:
                w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0, eviction_policy="evict_first")
        else:
            k_ok = (k0 + rk < k_per_split) & (k_start + k0 + rk < K)
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(
                w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first"
            )
        if USE_DOT:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            acc += tl.sum(prod, axis=2)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out = out_ptr + pid_s * stride_os + rm[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_splits(part_ptr, y_ptr, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


def kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 128,
    split_k: int = 4,
    num_warps: int = 4,
    num_stages: int = 4,
    use_dot: bool = True,
):
    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError("x and w need contiguous rows")
    if not use_dot:
        block_m = min(block_m, triton.next_power_of_2(m))
    # Each split covers a whole number of block_k steps.
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    even_k = k_per_split * splits == k
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    out = y if splits == 1 else torch.empty((splits, m, n), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), splits)
    _skinny_gemm[grid](
        x, w, out, m, n, k, k_per_split,
        x.stride(0), w.stride(0), n, 1, m * n,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=even_k, EVEN_N=n % block_n == 0, USE_DOT=use_dot,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if splits > 1:
        block = 1024
        _sum_splits[(triton.cdiv(m * n, block),)](
            out, y, m * n, SPLITS=splits, BLOCK=block, num_warps=4
        )
    return y

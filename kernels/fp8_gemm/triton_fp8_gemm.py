"""fp8 GEMM in Triton: tl.dot on fp8 e4m3 tiles with fp32 accumulation, the scales applied in
fp32. Per tensor, one product over all of k scaled once at the end; with block scales, each
k-block's partial product is scaled by its activation (per row) and weight (per column) scales
and added to the accumulator (block_k never straddles a scale block). Output tiles are walked in
groups of `group_m` row-tiles, so neighbouring programs share weight tiles in L2.
"""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_m": [16, 32, 64, 128],
    "block_n": [32, 64, 128, 256],
    "block_k": [32, 64, 128],
    "group_m": [1, 4, 8],
    "num_warps": [2, 4, 8],
    "num_stages": [1, 2, 3, 4, 5],
}


@triton.jit
def _fp8_gemm(
    a_ptr, w_ptr, sa_ptr, sw_ptr, out_ptr, M, N, K,
    stride_am, stride_wn, stride_sam, stride_swn, stride_om,
    SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, PER_TENSOR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + rk < K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if PER_TENSOR:
            acc = tl.dot(a, tl.trans(w), acc)
        else:
            part = tl.dot(a, tl.trans(w))
            kb = k0 // SCALE_K
            sa = tl.load(sa_ptr + rm * stride_sam + kb, mask=m_ok, other=0.0)
            sw = tl.load(sw_ptr + (rn // SCALE_N) * stride_swn + kb, mask=n_ok, other=0.0)
            acc += part * sa[:, None] * sw[None, :]
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if PER_TENSOR:
        acc = acc * (tl.load(sa_ptr) * tl.load(sw_ptr))
    out_ptrs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def kernel(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block_m: int = 0,
    block_n: int = 128,
    block_k: int = 128,
    group_m: int = 8,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    m, k = a.shape
    n = w.shape[0]
    a, w = a.contiguous(), w.contiguous()
    per_tensor = a_scale.numel() == 1 and w_scale.numel() == 1
    if per_tensor:
        scale_n, scale_k = n, k
    else:
        scale_n, scale_k = n // w_scale.shape[0], k // a_scale.shape[1]
        block_k = min(block_k, scale_k)  # one scale per k-tile
    if block_m <= 0:  # rows padded to 16 for the tensor cores
        block_m = min(128, max(16, triton.next_power_of_2(m)))
    out = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_gemm[grid](
        a, w, a_scale, w_scale, out, m, n, k,
        a.stride(0), w.stride(0), a_scale.stride(0), w_scale.stride(0), out.stride(0),
        SCALE_N=scale_n, SCALE_K=scale_k, PER_TENSOR=per_tensor,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out

"""FP8 GEMM (per-tensor or per-tile scales) in Triton with host-side TMA tensor descriptors."""

from functools import lru_cache

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LANGUAGE = "triton"
PARAMS = {"num_stages": [3, 4]}


@lru_cache(maxsize=1)
def _install_allocator() -> None:
    def alloc_fn(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc_fn)


@triton.jit
def _fp8_tma(
    a_desc,
    w_desc,
    as_ptr,
    ws_ptr,
    y_ptr,
    M,
    N,
    K,
    sasm,
    sask,
    swsn,
    swsk,
    A_ROWS: tl.constexpr,
    W_ROWS: tl.constexpr,
    SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k0])
        w = w_desc.load([pid_n * BLOCK_N, k0])
        part = tl.dot(a, w.T)
        sa = tl.load(
            as_ptr + (rm // A_ROWS) * sasm + (k0 // SCALE_K) * sask, mask=rm < M, other=0.0
        )
        sw = tl.load(
            ws_ptr + (rn // W_ROWS) * swsn + (k0 // SCALE_K) * swsk, mask=rn < N, other=0.0
        )
        acc += part * sa[:, None] * sw[None, :]
    tl.store(
        y_ptr + rm[:, None] * N + rn[None, :],
        acc.to(tl.bfloat16),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def kernel(a, a_scale, w, w_scale, num_stages: int = 3):
    _install_allocator()
    M, K = a.shape
    N = w.shape[0]
    BM, BN, BK = 64, 128, 128
    scale_k = min(K // a_scale.shape[1], K // w_scale.shape[1])
    bk = min(BK, scale_k)
    a_desc = TensorDescriptor.from_tensor(a, [BM, bk])
    w_desc = TensorDescriptor.from_tensor(w, [BN, bk])
    y = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    _fp8_tma[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
        a_desc, w_desc, a_scale, w_scale, y, M, N, K, *a_scale.stride(), *w_scale.stride(),
        A_ROWS=M // a_scale.shape[0], W_ROWS=N // w_scale.shape[0], SCALE_K=scale_k,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=bk, num_stages=num_stages, num_warps=4,
    )  # fmt: skip
    return y

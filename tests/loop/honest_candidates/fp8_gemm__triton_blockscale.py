"""FP8 GEMM with per-tile scales in Triton: y = (a * a_scale) @ (w * w_scale).T in bfloat16.
a's scales cover (rows_a_tile, BLOCK_K) tiles and w's (rows_w_tile, BLOCK_K); each K step does
one tl.dot in float32 and applies both scales to the partial product."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"block_m": [16, 64], "block_n": [64, 128], "num_warps": [4, 8], "num_stages": [2, 3]}


@triton.jit
def _fp8_gemm(
    a_ptr,
    as_ptr,
    w_ptr,
    ws_ptr,
    y_ptr,
    M,
    N,
    K,
    sam,
    sak,
    swn,
    swk,
    sasm,
    sask,
    swsn,
    swsk,
    sym,
    syn,
    A_ROWS: tl.constexpr,
    A_COLS: tl.constexpr,
    W_ROWS: tl.constexpr,
    W_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            a_ptr + rm[:, None] * sam + kk[None, :] * sak,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + rn[None, :] * swn + kk[:, None] * swk,
            mask=(rn[None, :] < N) & (kk[:, None] < K),
            other=0.0,
        )
        part = tl.dot(a, w, out_dtype=tl.float32)
        sa = tl.load(as_ptr + (rm // A_ROWS) * sasm + (k0 // A_COLS) * sask, mask=rm < M, other=0.0)
        sw = tl.load(ws_ptr + (rn // W_ROWS) * swsn + (k0 // W_COLS) * swsk, mask=rn < N, other=0.0)
        acc += part * sa[:, None] * sw[None, :]
    tl.store(
        y_ptr + rm[:, None] * sym + rn[None, :] * syn,
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def kernel(
    a,
    a_scale,
    w,
    w_scale,
    block_m: int = 64,
    block_n: int = 128,
    num_warps: int = 4,
    num_stages: int = 3,
):
    M, K = a.shape
    N = w.shape[0]
    a_rows, a_cols = M // a_scale.shape[0], K // a_scale.shape[1]
    w_rows, w_cols = N // w_scale.shape[0], K // w_scale.shape[1]
    block_k = min(a_cols, w_cols, 128)
    y = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _fp8_gemm[grid](
        a, a_scale, w, w_scale, y, M, N, K,
        *a.stride(), *w.stride(), *a_scale.stride(), *w_scale.stride(), *y.stride(),
        A_ROWS=a_rows, A_COLS=a_cols, W_ROWS=w_rows, W_COLS=w_cols,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return y

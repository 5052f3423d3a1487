"""A GEMV with its residual add folded in, in Triton: a program takes one row of x and
`block_n` outputs, streams their rows of W in `block_k` slices, and adds the residual (fetched
before the loop) to the float32 sums before rounding. Meant for decode (a few rows): every row
of x reads W again."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_n": [8, 16, 32, 64],
    "block_k": [32, 64, 128, 256, 512, 1024],
    "num_warps": [2, 4, 8],
}


@triton.jit
def _gemv_residual(
    x_ptr, w_ptr, r_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rn[:, None].to(tl.int64) * K
    acc = tl.load(r_ptr + row * N + rn, mask=n_ok, other=0.0).to(tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        x = tl.load(x_ptr + row * K + k, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(
            w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0,
            eviction_policy="evict_first",
        ).to(tl.float32)  # fmt: skip
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(y_ptr + row * N + rn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    block_n: int = 16,
    block_k: int = 512,
    num_warps: int = 4,
) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if w.shape != (n, k) or r.shape != (m, n):
        raise ValueError(
            f"w must be (n, {k}) and r ({m}, n), got {tuple(w.shape)}, {tuple(r.shape)}"
        )
    x, w, r = x.contiguous(), w.contiguous(), r.contiguous()
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y
    grid = (m, triton.cdiv(n, block_n))
    _gemv_residual[grid](x, w, r, y, n, k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return y

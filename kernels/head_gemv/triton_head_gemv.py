"""Per-head GEMV in Triton: a program takes `block_n` output rows of one head's weight for up to
`block_m` sequences, streaming that weight slice once in (block_n x block_k) tiles (evicted from
L2 first: no other program reads it). `use_dot` picks tensor cores (tl.dot, rows padded to 16)
or a broadcast multiply-reduce over k in float32. With `use_dot`, fp32 inputs are multiplied in
fp32 (input_precision "ieee": fused multiply-adds on the CUDA cores), not rounded to TF32.

x may be a strided view whose last dim is contiguous (as MLA's query slice is: 128 of a head's
192 columns), read in place rather than copied. The grid is (output blocks x sequence blocks,
heads), so a batch of any size launches (the y and z axes stop at 65535).

On Hopper and later it is launched with programmatic dependent launch: its first weight tile,
which nothing earlier in the stream writes, is loaded before `gdc_wait`, x only after it. It
does not let the kernel after it launch early (its grid is several waves at batch 16, and an
early dependent takes SMs from the later waves: in the DeepSeek b16 block the projection after
it took 77 us instead of 64, session 18).
"""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_m": [1, 4, 16],
    "block_n": [16, 32, 64, 128],
    "block_k": [32, 64, 128, 256],
    "num_warps": [2, 4, 8],
    "use_dot": [True, False],
}
MAX_HEADS = 65535
STRIDED_INPUTS = True  # a decoder block may pass x as a view (it copies only what it must)


@triton.jit
def _mac(acc, x_rows, w_rows, k0, m_ok, n_ok, K,
         BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, W=None):  # fmt: skip
    """acc plus one k tile's products (the weight tile `W` when already loaded); x_rows and
    w_rows point at each row's first column."""
    kk = k0 + tl.arange(0, BLOCK_K)
    k_ok = kk < K
    if W is None:
        W = _weights(w_rows, kk, n_ok, k_ok)
    x = tl.load(x_rows[:, None] + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    if USE_DOT:
        return tl.dot(x, tl.trans(W), acc, input_precision="ieee")
    return acc + tl.sum(x.to(tl.float32)[:, None, :] * W.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _weights(w_rows, kk, n_ok, k_ok):
    return tl.load(
        w_rows[:, None] + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0,
        eviction_policy="evict_first",
    )  # fmt: skip


@triton.jit
def _head_gemv(
    x_ptr, w_ptr, y_ptr, B, H, N, K, stride_xb, stride_xh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    n_blocks = tl.cdiv(N, BLOCK_N)
    rn = tl.program_id(0) % n_blocks * BLOCK_N + tl.arange(0, BLOCK_N)
    head = tl.program_id(1)
    rm = tl.program_id(0) // n_blocks * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < B
    n_ok = rn < N
    rows = rm.to(tl.int64) * H + head  # (sequence, head) rows of y
    x_rows = x_ptr + rm.to(tl.int64) * stride_xb + head.to(tl.int64) * stride_xh
    w_rows = w_ptr + (head.to(tl.int64) * N + rn) * K
    # The first weight tile, which nothing earlier in the stream writes, before the wait.
    kk = tl.arange(0, BLOCK_K)
    first = _weights(w_rows, kk, n_ok, kk < K)
    if PDL:
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _mac(acc, x_rows, w_rows, 0, m_ok, n_ok, K, BLOCK_K, USE_DOT, first)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        acc = _mac(acc, x_rows, w_rows, k0, m_ok, n_ok, K, BLOCK_K, USE_DOT)
    out = y_ptr + rows[:, None] * N + rn[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 128,
    num_warps: int = 4,
    use_dot: bool = True,
) -> torch.Tensor:
    b, h, k = x.shape
    if w.dim() != 3 or w.shape[0] != h or w.shape[2] != k:
        raise ValueError(f"w must be ({h}, n, {k}) for x {tuple(x.shape)}, got {tuple(w.shape)}")
    if use_dot and min(block_m, block_n, block_k) < 16:
        raise ValueError("use_dot needs block_m, block_n and block_k of 16 at least (tl.dot)")
    n = w.shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    w = w.contiguous()
    y = torch.empty((b, h, n), device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    if k == 0:
        return y.zero_()
    if h > MAX_HEADS:
        raise ValueError(f"{h} heads: at most {MAX_HEADS} (the grid's second axis)")
    grid = (triton.cdiv(n, block_n) * triton.cdiv(b, block_m), h)
    pdl = _pdl(x.device)
    _head_gemv[grid](
        x, w, y, b, h, n, k, x.stride(0), x.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, USE_DOT=bool(use_dot), PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    return y

"""RMSNorm, the q/k/v projection and rope in one Triton kernel, for decode (a few rows of x):
qk = rope(s * (x g) W_qk^T) and v = s * (x g) W_v^T with s = rsqrt(mean(x^2) + eps), in
float32, rounded once. The norm's sum of squares comes from the row of x the dots read, and
rope is the epilogue, so neither is a pass or a kernel of its own.

A q/k program holds `block_n` rotation pairs of one head (rows j and j + d/2 of W_qk, whose
outputs rope mixes) in registers, a v program 2 * `block_n` consecutive rows of W_v; K is padded
to a power of two (the padding masked off) and all of it loaded at once as the CUDA split-K GEMV
does, with as many warps as give each lane about `per_lane` 16-byte vectors. Then the program
normalises and dots each of up to `rows` rows of x; the q/k ones rotate the pairs by the row's
cos and sin.

On Hopper and later the kernel is launched with programmatic dependent launch. Its W and g
loads, which nothing earlier in the stream writes, are issued before `gdc_wait`, so they stream
while the kernel before it drains; x, cos and sin are read, and the outputs written, only after
the wait. Right after the wait it lets the kernel after it (the attention) launch, so that
kernel may rely on everything before this one being done, as torch.compile's PDL kernels do.
"""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "per_lane": [1, 2, 4, 8],
    "block_n": [1, 2, 4],
    "rows": [1, 2, 4],
}
EPS = 1e-6
MAX_WARPS = 32


@triton.jit
def _rmsnorm_gemv_rope(
    x_ptr, g_ptr, wqk_ptr, wv_ptr, cos_ptr, sin_ptr, qk_ptr, v_ptr, M, N_QK, N_V, eps,
    pair_programs,
    K: tl.constexpr, K_PAD: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    m0 = tl.program_id(1) * ROWS
    lane = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, K_PAD)
    k_ok = rk < K
    is_qk = pid < pair_programs
    # A q/k program's rows: BLOCK_N pairs (j, j + HALF) of one head; a v program's: two tiles
    # of BLOCK_N consecutive rows.
    pair = pid * BLOCK_N + lane
    j = pair % HALF
    row_a = tl.where(
        is_qk, (pair // HALF) * (2 * HALF) + j, (pid - pair_programs) * 2 * BLOCK_N + lane
    )
    row_b = row_a + tl.where(is_qk, HALF, BLOCK_N)
    n_out = tl.where(is_qk, N_QK, N_V)
    w_rows = tl.where(is_qk, wqk_ptr, wv_ptr)
    a_ok = (row_a < n_out)[:, None] & k_ok[None, :]
    b_ok = (row_b < n_out)[:, None] & k_ok[None, :]
    w_a = tl.load(
        w_rows + row_a[:, None].to(tl.int64) * K + rk[None, :], mask=a_ok, other=0.0,
        eviction_policy="evict_first",
    )  # fmt: skip
    w_b = tl.load(
        w_rows + row_b[:, None].to(tl.int64) * K + rk[None, :], mask=b_ok, other=0.0,
        eviction_policy="evict_first",
    )  # fmt: skip
    g = tl.load(g_ptr + rk, mask=k_ok, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    for i in tl.static_range(ROWS):
        row = (m0 + i).to(tl.int64)
        # a row past M reads and writes nothing: its bounds are 0
        x_ok = rk < tl.where(row < M, K, 0)
        x = tl.load(x_ptr + row * K + rk, mask=x_ok, other=0.0).to(tl.float32)
        # fetched with x, before the sums' barriers; a v program rotates by nothing: cos 1, sin 0
        turns = lane < tl.where(row < M, tl.where(is_qk, BLOCK_N, 0), 0)
        c = tl.load(cos_ptr + row * HALF + j, mask=turns, other=1.0)
        s = tl.load(sin_ptr + row * HALF + j, mask=turns, other=0.0)
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        xg = (x * g.to(tl.float32))[None, :]
        za = tl.sum(w_a.to(tl.float32) * xg, axis=1) * scale
        zb = tl.sum(w_b.to(tl.float32) * xg, axis=1) * scale
        out = tl.where(is_qk, qk_ptr + row * N_QK, v_ptr + row * N_V)
        n_row = tl.where(row < M, n_out, 0)
        tl.store(out + row_a, (za * c - zb * s).to(qk_ptr.dtype.element_ty), mask=row_a < n_row)
        tl.store(out + row_b, (zb * c + za * s).to(qk_ptr.dtype.element_ty), mask=row_b < n_row)


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def warps_for(block_n: int, k_pad: int, per_lane: int) -> int:
    """Warps that give each lane about `per_lane` 16-byte vectors of the program's two W tiles
    (a power of two, 1 to MAX_WARPS)."""
    vectors = 2 * block_n * k_pad * 2 // 16
    return max(1, min(MAX_WARPS, vectors // (32 * per_lane)))


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w_qk: torch.Tensor,
    w_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    per_lane: int = 2,
    block_n: int = 1,
    rows: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    half = cos.shape[1]
    n_qk, n_v = w_qk.shape[0], w_v.shape[0]
    if w_qk.shape[1] != k or w_v.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w_qk and w_v must be (n, {k}) and g ({k},), got {tuple(w_qk.shape)}, "
            f"{tuple(w_v.shape)}, {tuple(g.shape)}"
        )
    if cos.shape != (m, half) or sin.shape != (m, half) or n_qk % (2 * half):
        raise ValueError(
            f"cos and sin must be ({m}, d/2) with w_qk's rows a multiple of d, got "
            f"{tuple(cos.shape)}, {tuple(sin.shape)}, {n_qk} rows"
        )
    if half % block_n:
        raise ValueError(f"block_n {block_n} must divide head_dim / 2 = {half}")
    x, g, w_qk, w_v = x.contiguous(), g.contiguous(), w_qk.contiguous(), w_v.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    qk = torch.empty((m, n_qk), device=x.device, dtype=x.dtype)
    v = torch.empty((m, n_v), device=x.device, dtype=x.dtype)
    if m == 0:
        return qk, v
    rows = min(rows, m)
    k_pad = triton.next_power_of_2(k)
    pdl = _pdl(x.device)
    pair_programs = n_qk // 2 // block_n
    grid = (pair_programs + triton.cdiv(n_v, 2 * block_n), triton.cdiv(m, rows))
    _rmsnorm_gemv_rope[grid](
        x, g, w_qk, w_v, cos, sin, qk, v, m, n_qk, n_v, EPS, pair_programs,
        K=k, K_PAD=k_pad, HALF=half, BLOCK_N=block_n, ROWS=rows, PDL=pdl,
        num_warps=warps_for(block_n, k_pad, per_lane), launch_pdl=pdl,
    )  # fmt: skip
    return qk, v

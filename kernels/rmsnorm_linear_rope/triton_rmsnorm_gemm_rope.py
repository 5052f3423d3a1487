"""RMSNorm, the q/k/v projection and rope in one Triton kernel on tensor cores, for a batch of up
to 16 rows at a time (decode at batch 16): qk = rope(s * (x g) W_qk^T) and v = s * (x g) W_v^T
with s = rsqrt(mean(x^2) + eps), in float32, rounded once.

A q/k program takes `block_n` rotation pairs of one head (rows j and j + d/2 of W_qk, whose
outputs rope mixes), a v program two tiles of `block_n` consecutive rows of W_v; each takes 16
rows of x and one of `split_k` slices of K, streams its two W tiles through tl.dot against x g
(rounded to x's dtype, as the eager norm rounds), and sums x^2 from the same x tiles, so the
norm's scale comes at the end for free. With one slice it applies the scale and the rotation (v
programs rotate by nothing) and writes. With more, it stores its float32 partials, and the last
of a tile's programs to arrive (an acq_rel count, after a barrier that puts every thread's stores
first) adds the slices' partials in a fixed order, runs the epilogue and resets the count.

`x_ahead` True loads the next K step's x and g while the current step's products run: x and g
feed the products through the norm (x^2 summed, x g rounded), not directly, so Triton's
pipelining does not prefetch them, and at 16 rows a program otherwise waits on their load every
step (45 % of the stall samples of the rope kernel's build, profiled on the H200 in session 14).

The counts live in one buffer per device, zeroed once when it is made; calls on the same device
must therefore not overlap (run them on one stream, as torch does by default).

On Hopper and later the kernel is launched with programmatic dependent launch: a program's first
W tiles, which nothing earlier in the stream writes, are loaded before `gdc_wait`; x, cos and
sin are read, and anything written, only after it. Right after the wait it lets the kernel after
it launch, so that kernel may rely on everything before this one being done.
"""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_n": [16, 32, 64],
    "block_k": [64, 128, 256],
    "split_k": [1, 2, 4, 8],
    "num_warps": [2, 4, 8],
    "num_stages": [2, 3, 4],
    "x_ahead": [False, True],
}
BLOCK_M = 16
EPS = 1e-6


@triton.jit
def _w_tile(rows, k, rows_ok, k_ok):
    """A tile of W: rows x the K step k, streamed once (evict first)."""
    return tl.load(
        rows + k[None, :], mask=rows_ok[:, None] & k_ok[None, :], other=0.0,
        eviction_policy="evict_first",
    )  # fmt: skip


@triton.jit
def _xg(x_rows, g_ptr, k, k_ok, m_ok):
    """One K step's x (rows x k) and g (k)."""
    x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    return x, tl.load(g_ptr + k, mask=k_ok, other=0.0)


@triton.jit
def _step(x, g, w_a, w_b, za, zb, squares):
    """One K step: x^2 summed, x g (in x's dtype) against the two W tiles."""
    xf = x.to(tl.float32)
    squares += tl.sum(xf * xf, axis=1)
    xg = (xf * g.to(tl.float32)[None, :]).to(x.dtype)
    za = tl.dot(xg, tl.trans(w_a), za, input_precision="ieee")
    zb = tl.dot(xg, tl.trans(w_b), zb, input_precision="ieee")
    return za, zb, squares


@triton.jit
def _rmsnorm_gemm_rope(
    x_ptr, g_ptr, wqk_ptr, wv_ptr, cos_ptr, sin_ptr, qk_ptr, v_ptr, part_ptr, squares_ptr,
    count_ptr, M, N_QK, N_V, K, k_per_split, pair_programs, eps,
    HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLITS: tl.constexpr, PDL: tl.constexpr, X_AHEAD: tl.constexpr,
):  # fmt: skip
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    lane = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    is_qk = pid_n < pair_programs
    # A q/k program's rows: BLOCK_N pairs (j, j + HALF) of one head; a v program's: two tiles
    # of BLOCK_N consecutive rows.
    pair = pid_n * BLOCK_N + lane
    j = pair % HALF
    v_row = (pid_n - pair_programs) * 2 * BLOCK_N + lane
    row_a = tl.where(is_qk, (pair // HALF) * (2 * HALF) + j, v_row)
    row_b = row_a + tl.where(is_qk, HALF, BLOCK_N)
    n_out = tl.where(is_qk, N_QK, N_V)
    a_ok, b_ok = row_a < n_out, row_b < n_out
    w_rows = tl.where(is_qk, wqk_ptr, wv_ptr)
    a_rows = w_rows + row_a[:, None].to(tl.int64) * K
    b_rows = w_rows + row_b[:, None].to(tl.int64) * K
    k_start = pid_s * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * K
    k = k_start + rk
    k_ok = k < k_stop
    w_a, w_b = _w_tile(a_rows, k, a_ok, k_ok), _w_tile(b_rows, k, b_ok, k_ok)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    za = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    zb = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
    x, g = _xg(x_rows, g_ptr, k, k_ok, m_ok)
    if X_AHEAD:  # the next step's x and g, loaded while this step's products run
        x_next, g_next = _xg(x_rows, g_ptr, k + BLOCK_K, k + BLOCK_K < k_stop, m_ok)
    za, zb, squares = _step(x, g, w_a, w_b, za, zb, squares)
    for k0 in range(k_start + BLOCK_K, k_stop, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_stop
        w_a, w_b = _w_tile(a_rows, k, a_ok, k_ok), _w_tile(b_rows, k, b_ok, k_ok)
        if X_AHEAD:
            x, g = x_next, g_next
            x_next, g_next = _xg(x_rows, g_ptr, k + BLOCK_K, k + BLOCK_K < k_stop, m_ok)
        else:
            x, g = _xg(x_rows, g_ptr, k, k_ok, m_ok)
        za, zb, squares = _step(x, g, w_a, w_b, za, zb, squares)
    done = SPLITS == 1
    if SPLITS > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        size: tl.constexpr = BLOCK_M * BLOCK_N
        cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_parts = part_ptr + tile.to(tl.int64) * (SPLITS * 2 * size) + cell
        tile_squares = squares_ptr + tile.to(tl.int64) * (SPLITS * BLOCK_M) + tl.arange(0, BLOCK_M)
        tl.store(tile_parts + pid_s * 2 * size, za)
        tl.store(tile_parts + pid_s * 2 * size + size, zb)
        tl.store(tile_squares + pid_s * BLOCK_M, squares)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == SPLITS - 1
        if done:
            tl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            za = tl.load(tile_parts)
            zb = tl.load(tile_parts + size)
            squares = tl.load(tile_squares)
            for s in tl.static_range(1, SPLITS):
                za += tl.load(tile_parts + s * 2 * size)
                zb += tl.load(tile_parts + s * 2 * size + size)
                squares += tl.load(tile_squares + s * BLOCK_M)
    if done:
        scale = tl.rsqrt(squares / K + eps)[:, None]
        za, zb = za * scale, zb * scale
        # a v program rotates by nothing: cos 1, sin 0
        turns = m_ok[:, None] & (lane < tl.where(is_qk, BLOCK_N, 0))[None, :]
        c = tl.load(cos_ptr + rm[:, None] * HALF + j[None, :], mask=turns, other=1.0)
        s = tl.load(sin_ptr + rm[:, None] * HALF + j[None, :], mask=turns, other=0.0)
        out = tl.where(is_qk, qk_ptr, v_ptr) + rm[:, None].to(tl.int64) * n_out
        dtype = qk_ptr.dtype.element_ty
        tl.store(
            out + row_a[None, :], (za * c - zb * s).to(dtype), mask=m_ok[:, None] & a_ok[None, :]
        )
        tl.store(
            out + row_b[None, :], (zb * c + za * s).to(dtype), mask=m_ok[:, None] & b_ok[None, :]
        )


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


# The arrival counts, per device: zero between calls (the last program of a tile resets its
# count). Every buffer is kept, as a CUDA graph may hold any of them.
_COUNTS: dict[torch.device, list[torch.Tensor]] = {}


def _arrival_counts(n: int, device: torch.device) -> torch.Tensor:
    held = _COUNTS.setdefault(device, [])
    if held and held[-1].numel() >= n:
        return held[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A buffer made while a graph is captured is zeroed only when the graph replays: this
        # call's graph zeroes its own counts, and no other call shares them.
        return torch.zeros(n, dtype=torch.int32, device=device)
    size = max(n, 2 * held[-1].numel() if held else 0)
    held.append(torch.zeros(size, dtype=torch.int32, device=device))
    return held[-1]


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w_qk: torch.Tensor,
    w_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    block_n: int = 32,
    block_k: int = 128,
    split_k: int = 2,
    num_warps: int = 4,
    num_stages: int = 3,
    x_ahead: bool = False,
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
    if k == 0:
        raise ValueError("x must have at least one column: the norm of an empty row is undefined")
    block_n = min(block_n, half)
    if half % block_n or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} must be a power of two dividing head_dim / 2 = {half}")
    if x.is_cuda and block_n < 16:
        raise ValueError(f"tensor-core tiles are 16 wide at least: head_dim / 2 = {half}")
    x, g, w_qk, w_v = x.contiguous(), g.contiguous(), w_qk.contiguous(), w_v.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    qk = torch.empty((m, n_qk), device=x.device, dtype=x.dtype)
    v = torch.empty((m, n_v), device=x.device, dtype=x.dtype)
    if m == 0:
        return qk, v
    # Each slice covers a whole number of block_k steps; no slice is empty.
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    pair_programs = n_qk // 2 // block_n
    grid = (pair_programs + triton.cdiv(n_v, 2 * block_n), splits, triton.cdiv(m, BLOCK_M))
    tiles = grid[0] * grid[2]
    if splits > 1:
        parts = torch.empty(
            tiles * splits * 2 * BLOCK_M * block_n, device=x.device, dtype=torch.float32
        )
        squares = torch.empty(tiles * splits * BLOCK_M, device=x.device, dtype=torch.float32)
        counts = _arrival_counts(tiles, x.device)
    else:
        parts = squares = counts = None
    pdl = _pdl(x.device)
    _rmsnorm_gemm_rope[grid](
        x, g, w_qk, w_v, cos, sin, qk, v, parts, squares, counts, m, n_qk, n_v, k, k_per_split,
        pair_programs, EPS, HALF=half, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLITS=splits, PDL=pdl, X_AHEAD=x_ahead, num_warps=num_warps, num_stages=num_stages,
        launch_pdl=pdl,
    )  # fmt: skip
    return qk, v

"""RMSNorm, the gate and up projections and SwiGLU in one Triton kernel on tensor cores, for a
batch of up to 16 rows at a time (decode at batch 16): y = silu(s * (x g) W_g^T) *
(s * (x g) W_u^T) with s = rsqrt(mean(x^2) + eps), in float32, rounded once.

A program takes a `block_n`-wide tile of the output for 16 rows of x and one of `split_k` slices
of K: it streams the gate's and the up projection's W tiles through tl.dot against x g (rounded
to x's dtype, as the eager norm rounds), and sums x^2 from the same x tiles, so the norm's scale
comes at the end for free. With one slice it applies the scale and SwiGLU and writes y. With
more, it stores its float32 partials, and the last of a tile's programs to arrive (an acq_rel
count, after a barrier that puts every thread's stores first) adds the slices' partials in a
fixed order, runs the epilogue and resets the count.

`x_ahead` True loads the next K step's x and g while the current step's products run: x and g
feed the products through the norm (x^2 summed, x g rounded), not directly, so Triton's
pipelining does not prefetch them, and at 16 rows a program otherwise waits on their load every
step (profiled on the H200 in session 14, 45 % of the rope kernel's stall samples were waits on
global loads, most of them on x's and g's).

The counts live in one buffer per device, zeroed once when it is made; calls on the same device
must therefore not overlap (run them on one stream, as torch does by default).

On Hopper and later the kernel is launched with programmatic dependent launch: a program's first
W tiles, which nothing earlier in the stream writes, are loaded before `gdc_wait`; x is read, and
anything written, only after it. Right after the wait it lets the kernel after it launch, so
that kernel may rely on everything before this one being done; with `late_dependents` it does so
only once its K loop ends, so that the next kernel's programs, which take their shared memory
and registers while they wait, arrive for this kernel's epilogue rather than its whole run. The
next kernel's own wait is for this one to finish either way.
"""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_n": [16, 32, 64, 128],
    "block_k": [64, 128, 256],
    "split_k": [1, 2, 4, 8],
    "num_warps": [2, 4, 8],
    "num_stages": [2, 3, 4],
    "x_ahead": [False, True],
    "late_dependents": [False, True],
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
def _step(x, g, w_gate, w_up, gate, up, squares):
    """One K step: x^2 summed, x g (in x's dtype) against the gate's and up's W tiles."""
    xf = x.to(tl.float32)
    squares += tl.sum(xf * xf, axis=1)
    xg = (xf * g.to(tl.float32)[None, :]).to(x.dtype)
    gate = tl.dot(xg, tl.trans(w_gate), gate, input_precision="ieee")
    up = tl.dot(xg, tl.trans(w_up), up, input_precision="ieee")
    return gate, up, squares


@triton.jit
def _rmsnorm_gemm_swiglu(
    x_ptr, g_ptr, w_ptr, y_ptr, part_ptr, squares_ptr, count_ptr, M, F, K, k_per_split, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    PDL: tl.constexpr, X_AHEAD: tl.constexpr, LATE_DEPENDENTS: tl.constexpr,
):  # fmt: skip
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < F
    k_start = pid_s * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * K
    gate_rows = w_ptr + rn[:, None].to(tl.int64) * K
    # (rn + F), not F.to(...): an F of 1 is a constexpr to Triton, with no .to
    up_rows = w_ptr + (rn + F)[:, None].to(tl.int64) * K
    k = k_start + rk
    k_ok = k < k_stop
    w_gate, w_up = _w_tile(gate_rows, k, n_ok, k_ok), _w_tile(up_rows, k, n_ok, k_ok)
    if PDL:
        tl.extra.cuda.gdc_wait()
        if not LATE_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
    x, g = _xg(x_rows, g_ptr, k, k_ok, m_ok)
    if X_AHEAD:  # the next step's x and g, loaded while this step's products run
        x_next, g_next = _xg(x_rows, g_ptr, k + BLOCK_K, k + BLOCK_K < k_stop, m_ok)
    gate, up, squares = _step(x, g, w_gate, w_up, gate, up, squares)
    for k0 in range(k_start + BLOCK_K, k_stop, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_stop
        w_gate, w_up = _w_tile(gate_rows, k, n_ok, k_ok), _w_tile(up_rows, k, n_ok, k_ok)
        if X_AHEAD:
            x, g = x_next, g_next
            x_next, g_next = _xg(x_rows, g_ptr, k + BLOCK_K, k + BLOCK_K < k_stop, m_ok)
        else:
            x, g = _xg(x_rows, g_ptr, k, k_ok, m_ok)
        gate, up, squares = _step(x, g, w_gate, w_up, gate, up, squares)
    if PDL and LATE_DEPENDENTS:  # the kernel after this one launches only as its products end
        tl.extra.cuda.gdc_launch_dependents()
    out_ok = m_ok[:, None] & n_ok[None, :]
    out = rm[:, None].to(tl.int64) * F + rn[None, :]
    done = SPLITS == 1
    if SPLITS > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        size: tl.constexpr = BLOCK_M * BLOCK_N
        cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_parts = part_ptr + tile.to(tl.int64) * (SPLITS * 2 * size) + cell
        tile_squares = squares_ptr + tile.to(tl.int64) * (SPLITS * BLOCK_M) + tl.arange(0, BLOCK_M)
        tl.store(tile_parts + pid_s * 2 * size, gate)
        tl.store(tile_parts + pid_s * 2 * size + size, up)
        tl.store(tile_squares + pid_s * BLOCK_M, squares)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == SPLITS - 1
        if done:
            tl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            gate = tl.load(tile_parts)
            up = tl.load(tile_parts + size)
            squares = tl.load(tile_squares)
            for s in tl.static_range(1, SPLITS):
                gate += tl.load(tile_parts + s * 2 * size)
                up += tl.load(tile_parts + s * 2 * size + size)
                squares += tl.load(tile_squares + s * BLOCK_M)
    if done:
        scale = tl.rsqrt(squares / K + eps)[:, None]
        gate, up = gate * scale, up * scale
        y = gate * tl.sigmoid(gate) * up
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=out_ok)


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
    w: torch.Tensor,
    block_n: int = 64,
    block_k: int = 128,
    split_k: int = 1,
    num_warps: int = 4,
    num_stages: int = 3,
    x_ahead: bool = False,
    late_dependents: bool = False,
) -> torch.Tensor:
    m, k = x.shape
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w must be (2f, {k}) and g ({k},), got {tuple(w.shape)}, {tuple(g.shape)}"
        )
    f = w.shape[0] // 2
    if k == 0:
        raise ValueError("x must have at least one column: the norm of an empty row is undefined")
    x, g, w = x.contiguous(), g.contiguous(), w.contiguous()
    y = torch.empty((m, f), device=x.device, dtype=x.dtype)
    if m == 0 or f == 0:
        return y
    # Each slice covers a whole number of block_k steps; no slice is empty.
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    grid = (triton.cdiv(f, block_n), splits, triton.cdiv(m, BLOCK_M))
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
    _rmsnorm_gemm_swiglu[grid](
        x, g, w, y, parts, squares, counts, m, f, k, k_per_split, EPS,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, PDL=pdl, X_AHEAD=x_ahead,
        LATE_DEPENDENTS=late_dependents,
        num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y

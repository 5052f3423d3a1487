"""A skinny GEMM with its residual add folded in, in Triton on tensor cores, for a batch of up to
16 rows at a time (decode at batch 16): y = x W^T + r, the residual added to the float32 sums.

A program takes a `block_n`-wide tile of the output for 16 rows of x and one of `split_k` slices
of K, streaming its W tiles through tl.dot. With one slice it adds the residual and writes y.
With more, it stores its float32 partial tile, and the last of a tile's programs to arrive (an
acq_rel count, after a barrier that puts every thread's stores first) adds the slices' partials
in a fixed order, adds the residual, writes y and resets the count: one kernel, where a split-K
GEMM takes a reduce kernel and model code an add (or a copy of r for cuBLAS's beta = 1).

The counts live in one buffer per device, zeroed once when it is made; calls on the same device
must therefore not overlap (run them on one stream, as torch does by default).

On Hopper and later the kernel is launched with programmatic dependent launch: a program's first
W tile, which nothing earlier in the stream writes, is loaded before `gdc_wait`; x and r are
read, and anything written, only after it. Right after the wait it lets the kernel after it
launch, so that kernel may rely on everything before this one being done; with `late_dependents`
only once its K loop ends (the next kernel's programs then take their shared memory and
registers for this one's epilogue, not its whole run). The next kernel's own wait is for this one
to finish either way.
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
    "late_dependents": [False, True],
}
BLOCK_M = 16


@triton.jit
def _w_tile(rows, k, rows_ok, k_ok):
    """A tile of W: rows x the K step k, streamed once (evict first)."""
    return tl.load(
        rows + k[None, :], mask=rows_ok[:, None] & k_ok[None, :], other=0.0,
        eviction_policy="evict_first",
    )  # fmt: skip


@triton.jit
def _gemm_residual(
    x_ptr, w_ptr, r_ptr, y_ptr, part_ptr, count_ptr, M, N, K, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    PDL: tl.constexpr, LATE_DEPENDENTS: tl.constexpr,
):  # fmt: skip
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    k_start = pid_s * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * K
    w_rows = w_ptr + rn[:, None].to(tl.int64) * K
    k = k_start + rk
    k_ok = k < k_stop
    w = _w_tile(w_rows, k, n_ok, k_ok)
    if PDL:
        tl.extra.cuda.gdc_wait()
        if not LATE_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    acc = tl.dot(x, tl.trans(w), input_precision="ieee")
    for k0 in range(k_start + BLOCK_K, k_stop, BLOCK_K):
        k = k0 + rk
        k_ok = k < k_stop
        w = _w_tile(w_rows, k, n_ok, k_ok)
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    if PDL and LATE_DEPENDENTS:  # the kernel after this one launches only as its products end
        tl.extra.cuda.gdc_launch_dependents()
    out_ok = m_ok[:, None] & n_ok[None, :]
    out = rm[:, None].to(tl.int64) * N + rn[None, :]
    done = SPLITS == 1
    if SPLITS > 1:
        tile = pid_m * tl.num_programs(0) + pid_n
        cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_parts = part_ptr + tile.to(tl.int64) * (SPLITS * BLOCK_M * BLOCK_N) + cell
        tl.store(tile_parts + pid_s * (BLOCK_M * BLOCK_N), acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == SPLITS - 1
        if done:
            tl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            acc = tl.load(tile_parts)
            for s in tl.static_range(1, SPLITS):
                acc += tl.load(tile_parts + s * (BLOCK_M * BLOCK_N))
    if done:
        acc += tl.load(r_ptr + out, mask=out_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=out_ok)


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
    w: torch.Tensor,
    r: torch.Tensor,
    block_n: int = 64,
    block_k: int = 128,
    split_k: int = 4,
    num_warps: int = 4,
    num_stages: int = 3,
    late_dependents: bool = False,
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
    if k == 0:  # an empty product: the residual alone
        return y.copy_(r)
    # Each slice covers a whole number of block_k steps; no slice is empty.
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    grid = (triton.cdiv(n, block_n), splits, triton.cdiv(m, BLOCK_M))
    tiles = grid[0] * grid[2]
    if splits > 1:
        parts = torch.empty(
            tiles * splits * BLOCK_M * block_n, device=x.device, dtype=torch.float32
        )
        counts = _arrival_counts(tiles, x.device)
    else:
        parts = counts = None
    pdl = _pdl(x.device)
    _gemm_residual[grid](
        x, w, r, y, parts, counts, m, n, k, k_per_split,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, PDL=pdl,
        LATE_DEPENDENTS=late_dependents, num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    return y

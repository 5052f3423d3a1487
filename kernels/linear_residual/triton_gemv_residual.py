"""A GEMV with its residual add folded in, in Triton, for decode (a few rows of x):
y = x W^T + r, the residual added to the float32 sums before rounding.

A program holds `block_n` whole rows of W in registers (K padded to a power of two, the padding
masked off), all loaded at once as the CUDA split-K GEMV does, with as many warps as give each
lane about `per_lane` 16-byte vectors; then it dots each of up to `rows` rows of x with them.

On Hopper and later the kernel is launched with programmatic dependent launch. Its W loads,
which nothing earlier in the stream writes, are issued before `gdc_wait`, so they stream while
the kernel before it drains; x and r are read, and y written, only after the wait. Right after
the wait it lets the kernel after it launch (`gdc_launch_dependents`), so that kernel may rely on
everything before this one being done, as torch.compile's PDL kernels do.

`prefetch_ahead` N > 0 has program p, before the wait, also ask L2 (`prefetch.global.L2`, no
register held) for the W rows of program p + N. Where the grid is larger than one wave of
resident programs, the programs that wait for the kernel before hold their own rows in registers
and bring the next wave's into L2, so the second wave reads L2, not DRAM, once the wait is over.
A prefetch changes no value. On a CUDA device only: the interpreter has no inline PTX.
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
    "prefetch_ahead": [0, 256, 512, 1024, 2048],
}
MAX_WARPS = 32


@triton.jit
def _gemv_residual(
    x_ptr, w_ptr, r_ptr, y_ptr, M, N,
    K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr, AHEAD: tl.constexpr, LINE: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m0 = tl.program_id(1) * ROWS
    rk = tl.arange(0, K_PAD)
    n_ok = rn < N
    k_ok = rk < K
    w = tl.load(
        w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :],
        mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first",
    )  # fmt: skip
    if AHEAD > 0:  # noqa: SIM102 (the first test is made when compiling, the second when running)
        if (tl.program_id(0) + AHEAD) * BLOCK_N < N:
            ahead = tl.minimum(rn + AHEAD * BLOCK_N, N - 1).to(tl.int64)
            lines = tl.minimum(tl.arange(0, K_PAD // LINE) * LINE, K - 1)
            _prefetch_l2(w_ptr + ahead[:, None] * K + lines[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    for i in tl.static_range(ROWS):
        row = (m0 + i).to(tl.int64)
        # a row past M reads and writes nothing: its bounds are 0
        x_ok = rk < tl.where(row < M, K, 0)
        x = tl.load(x_ptr + row * K + rk, mask=x_ok, other=0.0).to(tl.float32)
        out_ok = rn < tl.where(row < M, N, 0)
        # fetched with x, before the sum's barrier, so that its latency is not paid after it
        res = tl.load(r_ptr + row * N + rn, mask=out_ok, other=0.0).to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1) + res
        tl.store(y_ptr + row * N + rn, acc.to(y_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the line of each address (a hint: nothing is read into the program)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def warps_for(block_n: int, k_pad: int, per_lane: int) -> int:
    """Warps that give each lane about `per_lane` 16-byte vectors of the program's W tile (a
    power of two, 1 to MAX_WARPS)."""
    vectors = block_n * k_pad * 2 // 16
    return max(1, min(MAX_WARPS, vectors // (32 * per_lane)))


def kernel(
    x: torch.Tensor,
    w: torch.Tensor,
    r: torch.Tensor,
    per_lane: int = 2,
    block_n: int = 1,
    rows: int = 1,
    prefetch_ahead: int = 0,
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
    rows = min(rows, m)
    k_pad = triton.next_power_of_2(k)
    pdl = _pdl(x.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, rows))
    _gemv_residual[grid](
        x, w, r, y, m, n, K=k, K_PAD=k_pad, BLOCK_N=block_n, ROWS=rows, PDL=pdl,
        AHEAD=prefetch_ahead if x.device.type == "cuda" else 0,
        LINE=max(1, min(k_pad, 128 // w.element_size())),
        num_warps=warps_for(block_n, k_pad, per_lane), launch_pdl=pdl,
    )  # fmt: skip
    return y

"""RMSNorm folded into a GEMV, in Triton, for decode: y = rsqrt(mean(x^2) + eps) *
sum_k (x_k g_k) W_nk, in float32. A persistent, pipelined stream over W.

Each program owns a contiguous run of W's rows (the runs differ by at most one row block) and walks
it as one loop over (row block, k chunk) tiles, `block_n` rows by `block_k` columns. Triton's
software pipeliner keeps `num_stages - 1` tiles in flight in shared memory while the current one is
multiplied into a float32 accumulator, so a program never stops streaming between rows: the
one-shot GEMV (`triton_rmsnorm_gemv.py`) loads a whole row, reduces it and exits, and the SM's
traffic dips at each program's end. Before the loop each program sums x's squares (x is a few KiB,
read from L2); a row block's sums are reduced, scaled by the norm and stored when its last chunk is
in.

The grid is `programs_per_sm` programs per SM for each row of x (a few rows at decode; each
reads W again, from L2 when it fits).

On Hopper and later the kernel waits (`gdc_wait`) before it reads x, and lets the kernel after it
launch (programmatic dependent launch) once its run of W is done, or with `tail_tiles` T > 0 once
it reaches the T-th tile from its run's end (at its run's first tile where the run is shorter), so
that the next kernel's launch and first loads overlap this one's last tiles. With `overlap` it is
launched that way itself: its programs may then become resident while the kernel before it runs,
and before the wait each asks L2 (`prefetch.global.L2`, no register held) for the first `early_kib`
KiB of its run of W, which nothing earlier in the stream writes. Without (the default) it starts
when the kernel before it has ended. A prefetch changes no value; the interpreter has no inline PTX
and skips it.
"""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "block_n": [1, 2, 4, 8],
    "block_k": [64, 256, 1024, 2048, 4096, 8192, 16384, 32768],
    "num_stages": [2, 3, 4, 5, 6],
    "num_warps": [4, 8],
    "programs_per_sm": [1, 2, 3, 4],
    "overlap": [False, True],
    "early_kib": [0, 16, 64],
    "tail_tiles": [0, 2, 4, 8, 16],
}
EPS = 1e-6
LINE = 128  # bytes an L2 prefetch asks for


@triton.jit
def _rmsnorm_gemv_stream(
    x_ptr, g_ptr, w_ptr, y_ptr, N, progs, eps,
    K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
    PDL: tl.constexpr, EARLY_LANES: tl.constexpr, LINE_ELEMS: tl.constexpr,
    TAIL: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    n_blocks = tl.cdiv(N, BLOCK_N)
    k_tiles: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    first = pid * n_blocks // progs
    last = (pid + 1) * n_blocks // progs
    if EARLY_LANES > 0:
        # the run's first lines of W, one 128-byte line a lane (W's rows are contiguous), none
        # past the run's last row that exists
        start = first.to(tl.int64) * BLOCK_N * K
        end = tl.minimum(last * BLOCK_N, N).to(tl.int64) * K
        lines = tl.arange(0, EARLY_LANES).to(tl.int64) * LINE_ELEMS
        _prefetch_l2(w_ptr + start + tl.minimum(lines, end - start - 1))
    if PDL:
        tl.extra.cuda.gdc_wait()
    rb = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if k_tiles == 1:
        # one chunk spans K: x g is read once, into registers, not again with every tile
        x_row = tl.load(x_ptr + row * K + rk, mask=rk < K, other=0.0).to(tl.float32)
        squares = tl.sum(x_row * x_row, axis=0)
        xg_row = x_row * tl.load(g_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
    else:
        squares = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xs = tl.load(x_ptr + row * K + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
            squares += xs * xs
        squares = tl.sum(squares, axis=0)
    scale = tl.rsqrt(squares / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for t in tl.range(first * k_tiles, last * k_tiles, num_stages=STAGES):
        b = t // k_tiles
        kk = t - b * k_tiles
        rn = b * BLOCK_N + rb
        ks = kk * BLOCK_K + rk
        n_ok = rn < N
        k_ok = ks < K
        w = tl.load(
            w_ptr + rn[:, None].to(tl.int64) * K + ks[None, :],
            mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first",
        )  # fmt: skip
        if k_tiles == 1:
            xg = xg_row
        else:
            xg = tl.load(x_ptr + row * K + ks, mask=k_ok, other=0.0).to(tl.float32)
            xg *= tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        if PDL and TAIL > 0:  # noqa: SIM102 (the first test is made when compiling)
            if t == trigger_tile(first * k_tiles, last * k_tiles, TAIL):
                tl.extra.cuda.gdc_launch_dependents()
        acc += w.to(tl.float32) * xg[None, :]
        if kk == k_tiles - 1:
            out = tl.sum(acc, axis=1) * scale
            tl.store(y_ptr + row * N + rn, out.to(y_ptr.dtype.element_ty), mask=n_ok)
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    if PDL and TAIL == 0:
        # only once the run is done: with dependents let in at its start, the DeepSeek block's
        # next GEMV took 52 us longer (session 20)
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def trigger_tile(begin, end, TAIL: tl.constexpr):
    """The tile of a run [begin, end) at which the next kernel may launch: TAIL tiles from its
    end, or its first where the run is shorter."""
    return tl.maximum(begin, end - TAIL)


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


@functools.cache
def _sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; the interpreter's grid is kept small."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w: torch.Tensor,
    block_n: int = 1,
    block_k: int = 4096,
    num_stages: int = 4,
    num_warps: int = 8,
    programs_per_sm: int = 2,
    overlap: bool = False,
    early_kib: int = 0,
    tail_tiles: int = 0,
) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if w.shape != (n, k) or g.shape != (k,):
        raise ValueError(f"w must be (n, {k}) and g ({k},), got {tuple(w.shape)}, {tuple(g.shape)}")
    x, g, w = x.contiguous(), g.contiguous(), w.contiguous()
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y
    if m > 65535:
        raise ValueError(f"at most 65535 rows of x, got {m}")
    block_k = min(block_k, triton.next_power_of_2(k))
    n_blocks = triton.cdiv(n, block_n)
    programs = min(n_blocks, _sms(x.device) * programs_per_sm)
    if n_blocks * programs >= 2**31:  # a run's bounds are 32-bit products
        raise ValueError(f"n={n} in blocks of {block_n} is too many row blocks for one launch")
    pdl = _pdl(x.device)
    early = x.device.type == "cuda" and overlap and early_kib > 0
    early_lanes = triton.next_power_of_2(max(1, early_kib * 1024 // LINE)) if early else 0
    _rmsnorm_gemv_stream[(programs, m)](
        x, g, w, y, n, programs, EPS, K=k, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=num_stages, PDL=pdl,
        EARLY_LANES=early_lanes, TAIL=tail_tiles,
        LINE_ELEMS=max(1, LINE // w.element_size()),
        num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl and bool(overlap),
    )  # fmt: skip
    return y

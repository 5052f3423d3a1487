"""Skinny GEMM at 5 <= M <= 16 in raw CUDA through CuPy: a weight stream on tensor cores.

At M = 16 a GEMV on CUDA cores does 16 multiply-adds per weight loaded, more than the H200's
CUDA cores keep up with at its memory bandwidth; `mma.sync.m16n8k16` does them for free. Here
16 rows of W are the MMA's A operand and the (up to) 16 rows of x its B operand, 8 at a time:
y^T (16 n x 8 m) += W (16 n x 16 k) x^T (16 k x 8 m).

Each lane loads whole 16-byte vectors of W and x straight into registers, without shared
memory: a dot product does not care in which order it visits k, so within each 32-wide chunk
of k, lane (g, t) (g = lane / 4, t = lane % 4) takes the 8 values at 8t..8t+7 of W's rows g and
g + 8 and of x's rows g and g + 8, and hands them to two MMAs (k-steps), four values each, as
their fragment layout wants them (its logical columns 2t, 2t+1, 2t+8, 2t+9). A and B see the
same permutation of k, so the product is unchanged.

A block takes 16 * n_tiles rows of W; its k_warps warps split K by chunks (warp w takes chunks
w, w + k_warps, ...), `unroll` chunks a step, the next step's loads issued before this step's
MMAs (two register buffers), and add their partial tiles through shared memory at the end. Float32 accumulation, bfloat16 out. K must be a multiple of 8 with
16-byte aligned tensors, as every GPU shape of the task is; more than 16 rows go 16 to a launch.

Launched on torch's current stream, so it is captured in CUDA graphs.
"""

import functools
from dataclasses import dataclass

import cupy
import numpy
import torch

LANGUAGE = "cupy"
PARAMS = {
    "k_warps": [4, 8, 16],
    "n_tiles": [1, 2, 4],
    "unroll": [1, 2, 4],
}
ROWS_PER_LAUNCH = 16
MAX_WARP_TILES = 32  # k_warps x n_tiles partial 16 x 16 tiles: 32 KiB of shared memory
MMA_MIN_CAPABILITY = (8, 0)

SOURCE = r"""
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        return (unsigned short)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// d += a (16 x 16, row-major) * b (16 x 8, column-major), bfloat16 in, float32 accumulated.
__device__ __forceinline__ void mma_bf16(float* d, unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A 32-wide chunk of k: W rows g and g + 8 of a tile (wlo, whi) against x rows g and g + 8
// (x0: rows 0-7, x1: rows 8-15), as two k-steps of four values a lane.
__device__ __forceinline__ void chunk_mma(float* acc0, float* acc1, uint4 wlo, uint4 whi,
                                          uint4 x0, uint4 x1) {
    mma_bf16(acc0, wlo.x, whi.x, wlo.y, whi.y, x0.x, x0.y);
    mma_bf16(acc0, wlo.z, whi.z, wlo.w, whi.w, x0.z, x0.w);
#if HALVES == 2
    mma_bf16(acc1, wlo.x, whi.x, wlo.y, whi.y, x1.x, x1.y);
    mma_bf16(acc1, wlo.z, whi.z, wlo.w, whi.w, x1.z, x1.w);
#endif
}

// One step of a warp: UNROLL chunks from chunk c0, KW apart (zeros past K, N or M).
__device__ __forceinline__ void load_step(uint4 (&wv)[UNROLL][NT][2], uint4 (&xv)[UNROLL][2],
                                          int c0, int chunks, int k8, int t,
                                          const uint4* const (&wp)[NT][2], const bool (&wr)[NT][2],
                                          const uint4* x0p, const uint4* x1p, bool xr0,
                                          bool xr1) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int c = c0 + u * KW;
        const int v = 4 * c;  // this chunk's first vector; the lane takes v + t
        const bool live = c < chunks && v + t < k8;
        #pragma unroll
        for (int r = 0; r < NT; ++r)
            #pragma unroll
            for (int h = 0; h < 2; ++h)
                wv[u][r][h] = live && wr[r][h] ? load_stream(wp[r][h] + v) : zero;
        xv[u][0] = live && xr0 ? __ldg(x0p + v) : zero;
        xv[u][1] = live && xr1 ? __ldg(x1p + v) : zero;
    }
}

__device__ __forceinline__ void mma_step(float (&acc)[NT][2][4], const uint4 (&wv)[UNROLL][NT][2],
                                         const uint4 (&xv)[UNROLL][2]) {
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        #pragma unroll
        for (int r = 0; r < NT; ++r)
            chunk_mma(acc[r][0], acc[r][1], wv[u][r][0], wv[u][r][1], xv[u][0], xv[u][1]);
}

extern "C" __global__ void __launch_bounds__(32 * KW) gemv_mma_bf16(
    const uint4* __restrict__ x, const uint4* __restrict__ w, unsigned short* __restrict__ y,
    long long M, long long N, long long k8_, long long m0)
{
    __shared__ float part[KW][NT][HALVES][32][4];
    const int k8 = (int)k8_;
    const int chunks = (k8 + 3) / 4;  // 32-wide chunks of k (4 vectors of 8)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const long long n0 = (long long)blockIdx.x * (16 * NT);

    // This lane's rows: of x, rows m0 + g and m0 + g + 8 (zero past M); of W, g and g + 8 of
    // each tile (zero past N).
    const bool xr0 = m0 + g < M, xr1 = m0 + g + 8 < M;
    const uint4* x0p = x + (m0 + g) * k8 + t;
    const uint4* x1p = x + (m0 + g + 8) * k8 + t;
    const uint4* wp[NT][2];
    bool wr[NT][2];
    #pragma unroll
    for (int r = 0; r < NT; ++r) {
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long n = n0 + 16 * r + g + 8 * h;
            wr[r][h] = n < N;
            wp[r][h] = w + (wr[r][h] ? n : 0) * k8 + t;
        }
    }

    float acc[NT][2][4];
    #pragma unroll
    for (int r = 0; r < NT; ++r)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][h][j] = 0.f;

    // Two register buffers: the next step's loads are in flight while this step's MMAs run.
    uint4 wa[UNROLL][NT][2], xa[UNROLL][2], wb[UNROLL][NT][2], xb[UNROLL][2];
    const int step = KW * UNROLL;
    load_step(wa, xa, warp, chunks, k8, t, wp, wr, x0p, x1p, xr0, xr1);
    for (int c0 = warp; c0 < chunks; c0 += 2 * step) {
        load_step(wb, xb, c0 + step, chunks, k8, t, wp, wr, x0p, x1p, xr0, xr1);
        mma_step(acc, wa, xa);
        if (c0 + step >= chunks) break;
        load_step(wa, xa, c0 + 2 * step, chunks, k8, t, wp, wr, x0p, x1p, xr0, xr1);
        mma_step(acc, wb, xb);
    }

    #pragma unroll
    for (int r = 0; r < NT; ++r)
        #pragma unroll
        for (int h = 0; h < HALVES; ++h)
            #pragma unroll
            for (int j = 0; j < 4; ++j) part[warp][r][h][lane][j] = acc[r][h][j];
    __syncthreads();

    // The warps' partial tiles added in a fixed order; a C fragment's element j of lane (g, t)
    // is (n = g + 8 (j / 2), m = 2t + j % 2) of its 16 x 8 tile.
    for (int e = threadIdx.x; e < NT * HALVES * 32 * 4; e += 32 * KW) {
        const int j = e & 3, l = (e >> 2) & 31, h = (e >> 7) % HALVES, r = (e >> 7) / HALVES;
        const long long n = n0 + 16 * r + (l >> 2) + 8 * (j >> 1);
        const long long m = m0 + 8 * h + 2 * (l & 3) + (j & 1);
        if (n < N && m < M) {
            float s = 0.f;
            #pragma unroll
            for (int kw = 0; kw < KW; ++kw) s += part[kw][r][h][l][j];
            y[m * N + n] = f2bf(s);
        }
    }
}
"""


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


def compile_options(k_warps: int, n_tiles: int, unroll: int, rows: int) -> tuple[str, ...]:
    """NVRTC options for one launch: `rows` (1-16) of x decide whether the second half of the
    MMA's columns (x's rows 8-15) is computed at all."""
    return (
        f"-DKW={k_warps}",
        f"-DNT={n_tiles}",
        f"-DUNROLL={unroll}",
        f"-DHALVES={2 if rows > 8 else 1}",
    )


@functools.cache
def _compiled(k_warps: int, n_tiles: int, unroll: int, halves_rows: int):
    options = compile_options(k_warps, n_tiles, unroll, halves_rows)
    return cupy.RawKernel(SOURCE, "gemv_mma_bf16", options=options)


def kernel(
    x: torch.Tensor, w: torch.Tensor, k_warps: int = 8, n_tiles: int = 1, unroll: int = 2
) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        raise TypeError(f"bf16 only, got {x.dtype} and {w.dtype}")
    if not (x.is_cuda and x.is_contiguous() and w.is_contiguous()):
        raise ValueError("x and w must be contiguous CUDA tensors")
    m, k = x.shape
    n = w.shape[0]
    if w.dim() != 2 or w.shape[1] != k or w.device != x.device:
        raise ValueError(f"w must be (n, {k}) on {x.device}, got {tuple(w.shape)} on {w.device}")
    if k % 8 or x.data_ptr() % 16 or w.data_ptr() % 16:
        raise ValueError("cupy_gemv_mma needs K a multiple of 8 and 16-byte aligned x and w")
    if k_warps * n_tiles > MAX_WARP_TILES:
        raise ValueError(
            f"k_warps x n_tiles = {k_warps * n_tiles}: at most {MAX_WARP_TILES} (the partial "
            "tiles' shared memory)"
        )
    if torch.cuda.get_device_capability(x.device) < MMA_MIN_CAPABILITY:
        raise ValueError("cupy_gemv_mma needs bfloat16 tensor cores (sm_80 or later)")
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y
    stream = _TorchStream(torch.cuda.current_stream(x.device).cuda_stream)
    grid = (-(-n // (16 * n_tiles)),)
    pointers = tuple(numpy.uint64(t.data_ptr()) for t in (x, w, y))
    sizes = (numpy.int64(m), numpy.int64(n), numpy.int64(k // 8))
    for m0 in range(0, m, ROWS_PER_LAUNCH):
        rows = min(ROWS_PER_LAUNCH, m - m0)
        launch = _compiled(k_warps, n_tiles, unroll, 16 if rows > 8 else 8)
        launch(grid, (32 * k_warps,), (*pointers, *sizes, numpy.int64(m0)), stream=stream)
    return y

"""RMSNorm folded into a GEMV, for M <= 4 rows, in raw CUDA through CuPy: y = rmsnorm(x) W^T
in one kernel, where model code runs a norm kernel and then a GEMV.

The GEMV is skinny_gemm's split-K one (cupy_gemv_splitk.py): a block takes `n_per_block`
outputs, a row of W shared by enough warps that each lane holds about `per_lane` 16-byte
vectors, all loaded at once. Every block reads the whole of x for its dot products anyway, so
it also sums x^2 from the same values and scales at the end:
y_n = rsqrt(mean(x^2) + eps) * sum_k (x_k g_k) W_nk. Float32 throughout (the normed x is not
rounded to bfloat16), bfloat16 out. K must be a multiple of 8 with 16-byte aligned tensors.

Launched on torch's current stream, so it is captured in CUDA graphs. On Hopper it lets the next
kernel launch at once, where that one is launched with programmatic dependent launch.
"""

import functools
from dataclasses import dataclass

import cupy
import numpy
import torch

LANGUAGE = "cupy"
PARAMS = {
    "per_lane": [2, 4, 8, 16],
    "n_per_block": [1, 2, 4],
    "rows": [1, 2, 4],
}
MAX_VECTORS_PER_LANE = 32
EPS = 1e-6

SOURCE = r"""
__device__ __forceinline__ float bf_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }

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

#define STRIDE (32 * KW)

// The lane's part of sum_k (x_k g_k) W_nk, and of sum_k x_k^2 for the norm, over 8 values of k.
__device__ __forceinline__ float dot8_scaled(uint4 a, uint4 g, uint4 b, float s, float& sq) {
    const unsigned av[4] = {a.x, a.y, a.z, a.w}, gv[4] = {g.x, g.y, g.z, g.w};
    const unsigned bv[4] = {b.x, b.y, b.z, b.w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = bf_lo(av[i]), hi = bf_hi(av[i]);
        sq = fmaf(lo, lo, fmaf(hi, hi, sq));
        s = fmaf(lo * bf_lo(gv[i]), bf_lo(bv[i]), s);
        s = fmaf(hi * bf_hi(gv[i]), bf_hi(bv[i]), s);
    }
    return s;
}

extern "C" __global__ void __launch_bounds__(32 * KW * NPB) rmsnorm_gemv_bf16(
    const uint4* __restrict__ x, const uint4* __restrict__ g, const uint4* __restrict__ w,
    unsigned short* __restrict__ y, long long M, long long N, long long k8_, long long m0,
    float eps)
{
#if __CUDA_ARCH__ >= 900
    // A kernel launched after this one with programmatic dependent launch may start now: its
    // own griddepcontrol.wait still orders its reads after this kernel's writes.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    __shared__ float part[NPB][KW][ROWS];
    __shared__ float part_sq[NPB][KW][ROWS];
    const int k8 = (int)k8_;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int local_n = warp / KW, kpart = warp % KW;
    const long long n = (long long)blockIdx.x * NPB + local_n;
    const int i0 = kpart * 32 + lane;
    // A lane whose vectors all lie in the row loads without a bounds check (kept predicates
    // would cost a register per vector).
    const bool whole = i0 + (VPL - 1) * STRIDE < k8;
    float acc[ROWS], sq[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = sq[r] = 0.f;
    if (n < N) {
        const uint4* wr = w + n * k8 + i0;
        uint4 wv[VPL];
        if (whole) {
            #pragma unroll
            for (int j = 0; j < VPL; ++j) wv[j] = load_stream(wr + j * STRIDE);
        } else {
            #pragma unroll
            for (int j = 0; j < VPL; ++j)
                wv[j] = i0 + j * STRIDE < k8 ? load_stream(wr + j * STRIDE)
                                             : make_uint4(0u, 0u, 0u, 0u);
        }
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (m0 + r < M) {
                const uint4* xr = x + (m0 + r) * k8 + i0;
                #pragma unroll
                for (int j = 0; j < VPL; ++j) {
                    if (whole || i0 + j * STRIDE < k8) {
                        acc[r] = dot8_scaled(__ldg(xr + j * STRIDE), __ldg(g + i0 + j * STRIDE),
                                             wv[j], acc[r], sq[r]);
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
            sq[r] += __shfl_xor_sync(0xffffffffu, sq[r], off);
        }
    }
    if (lane == 0) {
        #pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            part[local_n][kpart][r] = acc[r];
            part_sq[local_n][kpart][r] = sq[r];
        }
    }
    __syncthreads();
    if (threadIdx.x < NPB * ROWS) {
        const int ln = threadIdx.x / ROWS, r = threadIdx.x % ROWS;
        const long long nn = (long long)blockIdx.x * NPB + ln;
        if (nn < N && m0 + r < M) {
            float s = 0.f, q = 0.f;
            #pragma unroll
            for (int kp = 0; kp < KW; ++kp) {
                s += part[ln][kp][r];
                q += part_sq[ln][kp][r];
            }
            y[(m0 + r) * N + nn] = f2bf(s * rsqrtf(q / (float)(k8 * 8) + eps));
        }
    }
}
"""


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


def plan(k: int, per_lane: int, n_per_block: int) -> tuple[int, int]:
    """(k_warps, vectors per lane): as many warps per output as give each lane about `per_lane`
    16-byte vectors of a row of W, within 32 warps a block (more vectors per lane past that)."""
    k8 = max(k // 8, 1)
    k_warps = min(-(-k8 // (32 * per_lane)), max(1, 32 // n_per_block))
    vectors = -(-k8 // (32 * k_warps))
    if vectors > MAX_VECTORS_PER_LANE:
        raise ValueError(
            f"K = {k} needs {vectors} vectors per lane (at most {MAX_VECTORS_PER_LANE})"
        )
    return k_warps, vectors


def compile_options(rows: int, k_warps: int, n_per_block: int, per_lane: int) -> tuple[str, ...]:
    return (
        f"-DROWS={rows}",
        f"-DKW={k_warps}",
        f"-DNPB={n_per_block}",
        f"-DVPL={per_lane}",
    )


@functools.cache
def _compiled(rows: int, k_warps: int, n_per_block: int, per_lane: int):
    options = compile_options(rows, k_warps, n_per_block, per_lane)
    return cupy.RawKernel(SOURCE, "rmsnorm_gemv_bf16", options=options)


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w: torch.Tensor,
    per_lane: int = 4,
    n_per_block: int = 2,
    rows: int = 4,
) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or g.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        raise TypeError(f"bf16 only, got {x.dtype}, {g.dtype} and {w.dtype}")
    if not (x.is_cuda and x.is_contiguous() and g.is_contiguous() and w.is_contiguous()):
        raise ValueError("x, g and w must be contiguous CUDA tensors")
    m, k = x.shape
    n = w.shape[0]
    if w.dim() != 2 or w.shape[1] != k or w.device != x.device:
        raise ValueError(f"w must be (n, {k}) on {x.device}, got {tuple(w.shape)} on {w.device}")
    if g.shape != (k,) or g.device != x.device:
        raise ValueError(f"g must be ({k},) on {x.device}, got {tuple(g.shape)} on {g.device}")
    if k % 8 or any(t.data_ptr() % 16 for t in (x, g, w)):
        raise ValueError("cupy_rmsnorm_gemv needs K a multiple of 8 and 16-byte aligned tensors")
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return y
    rows = min(rows, m)
    k_warps, vectors = plan(k, per_lane, n_per_block)
    launch = _compiled(rows, k_warps, n_per_block, vectors)
    stream = _TorchStream(torch.cuda.current_stream(x.device).cuda_stream)
    grid = (-(-n // n_per_block),)
    block = (32 * k_warps * n_per_block,)
    pointers = tuple(numpy.uint64(t.data_ptr()) for t in (x, g, w, y))
    sizes = (numpy.int64(m), numpy.int64(n), numpy.int64(k // 8))
    for m0 in range(0, m, rows):
        args = (*pointers, *sizes, numpy.int64(m0), numpy.float32(EPS))
        launch(grid, block, args, stream=stream)
    return y

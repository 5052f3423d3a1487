"""Skinny GEMM as a raw CUDA GEMV through CuPy: one warp per output column, 16-byte streaming
loads of the weight row (L1 bypassed), `rows` rows of x per launch kept in registers, warp
shuffle reduction. bf16 is handled as raw bits, so no CUDA headers are needed. Launched on the
current torch stream, so it can be captured in a CUDA graph."""

from dataclasses import dataclass

import cupy
import numpy
import torch

LANGUAGE = "cupy"
PARAMS = {
    "rows": [1, 2, 4, 8, 16],
    "warps_per_block": [2, 4, 8, 16],
    "unroll": [1, 2, 4, 8],
}

_SOURCE = r"""
__device__ __forceinline__ float bf_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf1(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }

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
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    float s = bf_lo(a.x) * bf_lo(b.x);
    s = fmaf(bf_hi(a.x), bf_hi(b.x), s);
    s = fmaf(bf_lo(a.y), bf_lo(b.y), s);
    s = fmaf(bf_hi(a.y), bf_hi(b.y), s);
    s = fmaf(bf_lo(a.z), bf_lo(b.z), s);
    s = fmaf(bf_hi(a.z), bf_hi(b.z), s);
    s = fmaf(bf_lo(a.w), bf_lo(b.w), s);
    s = fmaf(bf_hi(a.w), bf_hi(b.w), s);
    return s;
}

extern "C" __global__ void gemv_bf16(
    const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
    unsigned short* __restrict__ y, int M, int N, int K, int m0)
{
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    const unsigned short* wrow = w + n * (long long)K;
#if VEC8
    const int k8 = K >> 3;
    const uint4* w4 = reinterpret_cast<const uint4*>(wrow);
    for (int base = 0; base < k8; base += 32 * UNROLL) {
        uint4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * 32 + lane;
            wv[u] = i < k8 ? load_stream(w4 + i) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * 32 + lane;
            if (i < k8) {
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if (m0 + r < M) {
                        const uint4* x4 = reinterpret_cast<const uint4*>(x + (long long)(m0 + r) * K);
                        acc[r] += dot8(__ldg(x4 + i), wv[u]);
                    }
                }
            }
        }
    }
#else
    for (int i = lane; i < K; i += 32) {
        const float wf = bf1(wrow[i]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (m0 + r < M) acc[r] = fmaf(bf1(x[(long long)(m0 + r) * K + i]), wf, acc[r]);
        }
    }
#endif
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (m0 + r < M) y[(long long)(m0 + r) * N + n] = f2bf(acc[r]);
        }
    }
}
"""

_kernels: dict[tuple[int, int, bool], object] = {}


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launch reads from a stream object: the raw cudaStream_t, here torch's."""

    ptr: int


def _get(rows: int, unroll: int, vec8: bool):
    key = (rows, unroll, vec8)
    if key not in _kernels:
        options = ("-std=c++17", f"-DROWS={rows}", f"-DUNROLL={unroll}", f"-DVEC8={int(vec8)}")
        _kernels[key] = cupy.RawKernel(_SOURCE, "gemv_bf16", options=options)
    return _kernels[key]


def kernel(
    x: torch.Tensor, w: torch.Tensor, rows: int = 4, warps_per_block: int = 8, unroll: int = 4
):
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        raise TypeError(f"bf16 only, got {x.dtype} and {w.dtype}")
    if not (x.is_cuda and x.is_contiguous() and w.is_contiguous()):
        raise ValueError("x and w must be contiguous CUDA tensors")
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    vec8 = k % 8 == 0 and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0
    rows = min(rows, m)
    launch = _get(rows, unroll, vec8)
    stream = _TorchStream(torch.cuda.current_stream(x.device).cuda_stream)
    grid = ((n + warps_per_block - 1) // warps_per_block,)
    block = (32 * warps_per_block,)
    pointers = tuple(numpy.uint64(t.data_ptr()) for t in (x, w, y))
    sizes = (numpy.int32(m), numpy.int32(n), numpy.int32(k))
    for m0 in range(0, m, rows):
        launch(grid, block, (*pointers, *sizes, numpy.int32(m0)), stream=stream)
    return y

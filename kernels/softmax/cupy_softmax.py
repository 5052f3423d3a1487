"""Softmax over a vocabulary in raw CUDA through CuPy, for bfloat16 rows (the GPU shapes).

`cluster=1`: one thread block per row. Pass 1 reads the row in 16-byte vectors (8 values), keeps
a running (max, sum) per thread with one exp per element, and copies the first `cache_kb` KiB of
the row into shared memory; a block reduction combines the threads. Pass 2 takes the cached part
from shared memory and only the rest from global memory (L2 if it is still there), and writes
with streaming stores.

`cluster>1` (Hopper): a 128k-vocabulary row is 250 KiB, more than one block's shared memory, so
one block re-reads part of its row (77 % of the copy bandwidth on the H200). Here a cluster of
`cluster` blocks shares the row: each block reads its contiguous slice once and keeps up to
`cache_kb` KiB of it in shared memory (all of it, for a 4-block cluster and a 128k row). The
blocks exchange their slice's (max, sum) through distributed shared memory (`mapa` and
`ld.shared::cluster`, between two cluster barriers), then each normalizes and writes its slice.
HBM sees one read and one write. Small slices let several blocks share an SM, so one block's
reads overlap another's writes.

Launched on torch's current stream, so it is captured in CUDA graphs.
"""

import functools
from dataclasses import dataclass

import cupy
import torch

LANGUAGE = "cupy"
PARAMS = {
    "threads": [256, 512, 1024],
    "cache_kb": [0, 96, 200],
    "unroll": [1, 2, 4],
    "cluster": [1, 2, 4, 8],
}
CLUSTER_MIN_CAPABILITY = (9, 0)

SOURCE = r"""
__device__ __forceinline__ float bf16_to_f(unsigned short v) {
    return __uint_as_float(((unsigned int)v) << 16);
}
__device__ __forceinline__ unsigned short f_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs here are finite)
    return (unsigned short)(u >> 16);
}
__device__ __forceinline__ void online(float xs, float& m, float& s) {
    // One exp per element: exp2(-|xs - m|) rescales the old sum or weighs the new value.
    float d = xs - m;
    float e = exp2f(-fabsf(d));
    if (d > 0.f) { s = fmaf(s, e, 1.f); m = xs; } else { s += e; }
}
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    s = s * exp2f(m - mx) + s2 * exp2f(m2 - mx);
    m = mx;
}
__device__ __forceinline__ void online8(uint4 p, float& m, float& s) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(&p);
    #pragma unroll
    for (int k = 0; k < 8; ++k) online(bf16_to_f(h[k]) * 1.4426950408889634f, m, s);
}
__device__ __forceinline__ uint4 normalize8(uint4 p, float mx, float inv) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(&p);
    uint4 out;
    unsigned short* o = reinterpret_cast<unsigned short*>(&out);
    #pragma unroll
    for (int k = 0; k < 8; ++k)
        o[k] = f_to_bf16(exp2f(fmaf(bf16_to_f(h[k]), 1.4426950408889634f, -mx)) * inv);
    return out;
}

extern "C" __global__ void softmax_bf16(
    const unsigned short* __restrict__ x, unsigned short* __restrict__ y,
    long long n_cols, long long stride_x, long long stride_y, long long n_vec,
    long long cached_vec)
{
    extern __shared__ uint4 cache[];
    __shared__ float red_m[32];
    __shared__ float red_s[32];
    const long long row = blockIdx.x;
    const unsigned short* xr = x + row * stride_x;
    unsigned short* yr = y + row * stride_y;
    const uint4* xv = reinterpret_cast<const uint4*>(xr);
    uint4* yv = reinterpret_cast<uint4*>(yr);
    const int step = blockDim.x * UNROLL;

    float m = -1e30f, s = 0.f;
    for (long long base = threadIdx.x; base < n_vec; base += step) {
        uint4 p[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < n_vec) p[u] = __ldg(xv + v);
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < n_vec) {
                if (v < cached_vec) cache[v] = p[u];
                online8(p[u], m, s);
            }
        }
    }
    for (long long c = n_vec * 8 + threadIdx.x; c < n_cols; c += blockDim.x)
        online(bf16_to_f(xr[c]) * 1.4426950408889634f, m, s);

    #pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    m = lane < n_warps ? red_m[lane] : -1e30f;
    s = lane < n_warps ? red_s[lane] : 0.f;
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
    const float mx = m, inv = 1.f / s;

    for (long long base = threadIdx.x; base < n_vec; base += step) {
        uint4 p[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < n_vec) p[u] = v < cached_vec ? cache[v] : __ldcs(xv + v);
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < n_vec) __stcs(yv + v, normalize8(p[u], mx, inv));
        }
    }
    for (long long c = n_vec * 8 + threadIdx.x; c < n_cols; c += blockDim.x)
        yr[c] = f_to_bf16(exp2f(fmaf(bf16_to_f(xr[c]), 1.4426950408889634f, -mx)) * inv);
}
#ifdef CLUSTER
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float load_from_block(const float* local, unsigned rank) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(local);
    unsigned remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) softmax_cluster_bf16(
    const unsigned short* __restrict__ x, unsigned short* __restrict__ y,
    long long n_cols, long long stride_x, long long stride_y, long long n_vec,
    long long slice_vec, long long cached_vec)
{
    extern __shared__ uint4 cache[];
    __shared__ float red_m[32];
    __shared__ float red_s[32];
    __shared__ float part[2];  // this block's (max, sum), read by the whole cluster
    const unsigned rank = cluster_rank();
    const long long row = blockIdx.x / CLUSTER;
    const unsigned short* xr = x + row * stride_x;
    unsigned short* yr = y + row * stride_y;
    const uint4* xv = reinterpret_cast<const uint4*>(xr);
    uint4* yv = reinterpret_cast<uint4*>(yr);
    const long long v0 = (long long)rank * slice_vec;
    const long long v1 = v0 + slice_vec < n_vec ? v0 + slice_vec : n_vec;
    const bool last = rank == CLUSTER - 1;
    const int step = blockDim.x * UNROLL;

    float m = -1e30f, s = 0.f;
    for (long long base = v0 + threadIdx.x; base < v1; base += step) {
        uint4 p[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < v1) p[u] = v - v0 < cached_vec ? __ldcs(xv + v) : __ldg(xv + v);
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < v1) {
                if (v - v0 < cached_vec) cache[v - v0] = p[u];
                online8(p[u], m, s);
            }
        }
    }
    if (last)  // columns past the last whole 16-byte vector (or every column, unaligned)
        for (long long c = n_vec * 8 + threadIdx.x; c < n_cols; c += blockDim.x)
            online(bf16_to_f(xr[c]) * 1.4426950408889634f, m, s);

    #pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    m = lane < n_warps ? red_m[lane] : -1e30f;
    s = lane < n_warps ? red_s[lane] : 0.f;
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        combine(m, s, __shfl_xor_sync(0xffffffffu, m, off), __shfl_xor_sync(0xffffffffu, s, off));
    if (threadIdx.x == 0) { part[0] = m; part[1] = s; }

    cluster_barrier();  // every block's part is written
    float mx = -1e30f, total = 0.f;
    #pragma unroll
    for (unsigned r = 0; r < CLUSTER; ++r)
        combine(mx, total, load_from_block(&part[0], r), load_from_block(&part[1], r));
    cluster_barrier();  // no block leaves while another may still read its part
    const float inv = 1.f / total;

    for (long long base = v0 + threadIdx.x; base < v1; base += step) {
        uint4 p[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < v1) p[u] = v - v0 < cached_vec ? cache[v - v0] : __ldcs(xv + v);
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long v = base + (long long)u * blockDim.x;
            if (v < v1) __stcs(yv + v, normalize8(p[u], mx, inv));
        }
    }
    if (last)
        for (long long c = n_vec * 8 + threadIdx.x; c < n_cols; c += blockDim.x)
            yr[c] = f_to_bf16(exp2f(fmaf(bf16_to_f(xr[c]), 1.4426950408889634f, -mx)) * inv);
}
#endif
"""


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


def compile_options(unroll: int, cluster: int) -> tuple[str, ...]:
    """NVRTC options; the cluster kernel is compiled only where it is asked for (sm_90+)."""
    cluster_flag = (f"-DCLUSTER={cluster}",) if cluster > 1 else ()
    return ("--use_fast_math", f"-DUNROLL={unroll}", *cluster_flag)


@functools.cache
def _compiled(unroll: int, cluster: int):
    name = "softmax_cluster_bf16" if cluster > 1 else "softmax_bf16"
    return cupy.RawKernel(SOURCE, name, options=compile_options(unroll, cluster))


@functools.cache
def _shared_limit(device: int) -> int:
    """Bytes of dynamic shared memory one block may opt into, less room for the static part."""
    return cupy.cuda.Device(device).attributes["MaxSharedMemoryPerBlockOptin"] - 1024


def kernel(
    x: torch.Tensor, threads: int = 1024, cache_kb: int = 200, unroll: int = 4, cluster: int = 1
) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError("cupy_softmax handles 2-D bfloat16 rows with unit column stride")
    if cluster > 1 and torch.cuda.get_device_capability(x.device) < CLUSTER_MIN_CAPABILITY:
        raise ValueError("cluster > 1 needs thread-block clusters (compute capability 9.0)")
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    aligned = x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
    aligned = aligned and x.stride(0) % 8 == 0 and y.stride(0) % 8 == 0
    n_vec = n_cols // 8 if aligned else 0
    slice_vec = -(-n_vec // cluster)
    cached_vec = min(slice_vec, cache_kb * 1024 // 16, _shared_limit(x.device.index) // 16)
    kern = _compiled(unroll, cluster)
    shared = max(cached_vec * 16, 16)
    if shared > kern.max_dynamic_shared_size_bytes:
        kern.max_dynamic_shared_size_bytes = shared
    args = (x.data_ptr(), y.data_ptr(), n_cols, x.stride(0), y.stride(0), n_vec)
    args += (slice_vec, cached_vec) if cluster > 1 else (cached_vec,)
    kern(
        (n_rows * cluster,),
        (threads,),
        args,
        shared_mem=shared,
        stream=_TorchStream(torch.cuda.current_stream(x.device).cuda_stream),
    )
    return y

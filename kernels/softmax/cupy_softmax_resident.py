"""Softmax over a vocabulary in raw CUDA through CuPy, with each row held in registers.

A row is split over a cluster of blocks (Hopper thread-block clusters; one block where the row
is short), so that each block's slice fits in its threads' registers: `slice_kb` is the largest
slice a block takes, and the cluster is the smallest power of two (at most 8) that gets there.
Each thread issues all of its 16-byte loads at once (one HBM read, many bytes in flight), then:
1. each warp takes the max of its values (on packed bfloat16 pairs) and e = 2^(x log2(e) - its
   max), one exponential per element, kept in place as float16 pairs (e is in [0, 1]: float16
   keeps 3 more bits than the bfloat16 output), and their sum;
2. the warps' (max, sum) pairs are combined over the block, then over the cluster in one
   exchange: each block writes its pair into every block's shared memory (distributed shared
   memory) before one cluster barrier;
3. e * 2^(warp max - row max) / sum, written with streaming stores.
So HBM sees one read and one write, and the special-function unit one exponential per element
(the online two-pass kernels spend two). Rows must be 16-byte aligned with a multiple of 8
columns, as every vocabulary of the task is.

Launched on torch's current stream, so it is captured in CUDA graphs.
"""

import functools
from dataclasses import dataclass

import cupy
import torch

LANGUAGE = "cupy"
PARAMS = {
    "threads": [128, 256, 512, 1024],
    "slice_kb": [8, 16, 32, 64, 128],
}
MAX_CLUSTER = 8
MAX_VECTORS_PER_THREAD = 32
CLUSTER_MIN_CAPABILITY = (9, 0)

SOURCE = r"""
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned max_bf16x2(unsigned a, unsigned b) {
    unsigned r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ void unpack_f16(unsigned u, float& lo, float& hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi) : "r"(u));
}
__device__ __forceinline__ unsigned exp_pair(unsigned u, float mx, float& s) {
    float lo = exp2f(fmaf(bf_lo(u), LOG2E, -mx));
    float hi = exp2f(fmaf(bf_hi(u), LOG2E, -mx));
    s += lo + hi;
    return pack_f16(lo, hi);
}
__device__ __forceinline__ unsigned scale_pair(unsigned u, float inv) {
    float lo, hi;
    unpack_f16(u, lo, hi);
    return pack_bf16(lo * inv, hi * inv);
}

#if CLUSTER > 1
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Arrive early and wait late: no block writes into another's shared memory before every block
// of the cluster has started.
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Writes v into `slot` of block `rank` of this cluster (distributed shared memory).
__device__ __forceinline__ void store_to_block(float* slot, unsigned rank, float v) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(slot);
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
}
#define CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#else
#define CLUSTER_DIMS
#endif

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
// A sum of 2^(t - m) taken against max m, counted against a larger max big (0 if empty; a NaN
// sum, from a NaN or +inf input, stays NaN, as in torch).
__device__ __forceinline__ float weigh(float s, float m, float big) {
    return s == 0.f ? 0.f : s * exp2f(m - big);
}
// The (max, sum) of n <= 32 pairs against their common max, one pair a lane; empty pairs
// (sum 0) take no part. Every lane of the warp gets the result.
__device__ __forceinline__ void combine(const float* ms, const float* ss, int n, float& m,
                                        float& s) {
    const int lane = threadIdx.x & 31;
    const float si = lane < n ? ss[lane] : 0.f;
    const float mi = si == 0.f ? NEG_INF : ms[lane];
    m = warp_max(mi);
    s = warp_sum(weigh(si, mi, m));
}

extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS softmax_resident_bf16(
    const uint4* __restrict__ x, uint4* __restrict__ y,
    long long stride_vx, long long stride_vy, long long n_vec_, long long slice_vec_)
{
    const int n_vec = (int)n_vec_, slice_vec = (int)slice_vec_;
    __shared__ float red_m[32];
    __shared__ float red_s[32];
#if CLUSTER > 1
    // Every block's (max, sum), written into each block by its owner (so no block reads
    // another's shared memory, and none has to wait for the others before it leaves).
    __shared__ float parts_m[CLUSTER], parts_s[CLUSTER];
    const unsigned rank = cluster_rank();
    cluster_arrive();
#else
    const unsigned rank = 0;
#endif
    const long long row = blockIdx.x / CLUSTER;
    const uint4* xv = x + row * stride_vx;
    uint4* yv = y + row * stride_vy;
    const int v0 = (int)rank * slice_vec;
    const int v1 = min(v0 + slice_vec, n_vec);

    // A thread whose vectors all lie in the slice (all but the last few) loads and stores
    // without a bounds check: kept predicates would cost a register per vector.
    const uint4* xt = xv + v0 + threadIdx.x;
    const bool whole = v0 + (int)threadIdx.x + (VPT - 1) * THREADS < v1;
    uint4 p[VPT];
    if (whole) {
        #pragma unroll
        for (int u = 0; u < VPT; ++u) p[u] = __ldcs(xt + u * THREADS);
    } else {
        #pragma unroll
        for (int u = 0; u < VPT; ++u) {
            p[u] = v0 + (int)threadIdx.x + u * THREADS < v1
                ? __ldcs(xt + u * THREADS)
                : make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u);  // -inf
        }
    }

    // Each warp takes its own max (on packed pairs, so the values stay packed until their
    // exponential) and exponentiates against it at once: the block's and the cluster's max
    // only rescale the sums, and each warp's output at the end.
    unsigned m2 = 0xff80ff80u;
    #pragma unroll
    for (int u = 0; u < VPT; ++u) {
        m2 = max_bf16x2(m2, max_bf16x2(max_bf16x2(p[u].x, p[u].y), max_bf16x2(p[u].z, p[u].w)));
    }
    const float wm = warp_max(fmaxf(bf_lo(m2), bf_hi(m2)));
    const float mw = wm == NEG_INF ? 0.f : wm * LOG2E;  // a warp of padding only sums to 0
    float s = 0.f;
    #pragma unroll
    for (int u = 0; u < VPT; ++u) {
        p[u].x = exp_pair(p[u].x, mw, s);
        p[u].y = exp_pair(p[u].y, mw, s);
        p[u].z = exp_pair(p[u].z, mw, s);
        p[u].w = exp_pair(p[u].w, mw, s);
    }
    s = warp_sum(s);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) { red_m[warp] = mw; red_s[warp] = s; }
    __syncthreads();
    float m_all, s_all;
    combine(red_m, red_s, THREADS >> 5, m_all, s_all);
#if CLUSTER > 1
    cluster_wait();
    if (threadIdx.x < CLUSTER) {
        store_to_block(&parts_m[rank], threadIdx.x, m_all);
        store_to_block(&parts_s[rank], threadIdx.x, s_all);
    }
    cluster_barrier();
    combine(parts_m, parts_s, CLUSTER, m_all, s_all);
#endif
    // A warp whose values are all -inf writes 0 (its 2^(mw - m_all) could overflow).
    const float inv = s == 0.f ? 0.f : exp2f(mw - m_all) / s_all;

    uint4* yt = yv + v0 + threadIdx.x;
    #pragma unroll
    for (int u = 0; u < VPT; ++u) {
        if (whole || v0 + (int)threadIdx.x + u * THREADS < v1) {
            uint4 o;
            o.x = scale_pair(p[u].x, inv);
            o.y = scale_pair(p[u].y, inv);
            o.z = scale_pair(p[u].z, inv);
            o.w = scale_pair(p[u].w, inv);
            __stcs(yt + u * THREADS, o);
        }
    }
}
"""


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


@dataclass(frozen=True)
class Launch:
    """How a row of `n_vec` 16-byte vectors is split: blocks per row and vectors per thread."""

    cluster: int
    slice_vec: int
    vectors_per_thread: int


def plan(n_vec: int, threads: int, slice_kb: int) -> Launch:
    """The smallest cluster whose slices fit `slice_kb`, capped at MAX_CLUSTER blocks."""
    cluster = 1
    while cluster < MAX_CLUSTER and n_vec * 16 > cluster * slice_kb * 1024:
        cluster *= 2
    slice_vec = max(1, -(-n_vec // cluster))
    vectors_per_thread = -(-slice_vec // threads)
    if vectors_per_thread > MAX_VECTORS_PER_THREAD:
        raise ValueError(
            f"a {n_vec * 16 // 1024} KiB row over {cluster} blocks of {threads} threads needs "
            f"{vectors_per_thread} vectors per thread (at most {MAX_VECTORS_PER_THREAD}): "
            "use more threads"
        )
    return Launch(cluster, slice_vec, vectors_per_thread)


def compile_options(threads: int, launch: Launch) -> tuple[str, ...]:
    """NVRTC options for one launch shape (cluster > 1 needs sm_90). The block size is a
    compile-time constant so that each thread's vector offsets are immediates, not registers."""
    return (
        "--use_fast_math",
        f"-DTHREADS={threads}",
        f"-DVPT={launch.vectors_per_thread}",
        f"-DCLUSTER={launch.cluster}",
    )


@functools.cache
def _compiled(threads: int, launch: Launch):
    return cupy.RawKernel(SOURCE, "softmax_resident_bf16", options=compile_options(threads, launch))


def kernel(x: torch.Tensor, threads: int = 512, slice_kb: int = 64) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError("cupy_softmax_resident handles 2-D bfloat16 rows with unit column stride")
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    if n_cols % 8 or x.stride(0) % 8 or x.data_ptr() % 16 or y.data_ptr() % 16:
        raise ValueError("cupy_softmax_resident needs 16-byte aligned rows of 8k columns")
    if n_rows == 0 or n_cols == 0:
        return y
    launch = plan(n_cols // 8, threads, slice_kb)
    if launch.cluster > 1 and torch.cuda.get_device_capability(x.device) < CLUSTER_MIN_CAPABILITY:
        raise ValueError("rows longer than slice_kb need thread-block clusters (sm_90)")
    kern = _compiled(threads, launch)
    kern(
        (n_rows * launch.cluster,),
        (threads,),
        (
            x.data_ptr(),
            y.data_ptr(),
            x.stride(0) // 8,
            y.stride(0) // 8,
            n_cols // 8,
            launch.slice_vec,
        ),
        stream=_TorchStream(torch.cuda.current_stream(x.device).cuda_stream),
    )
    return y

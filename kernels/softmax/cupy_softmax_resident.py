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
    "stages": [0, 1, 2],
    "rows_per_cluster": [2, 4, 8, 16],
}
MAX_CLUSTER = 8
MAX_VECTORS_PER_THREAD = 32
CLUSTER_MIN_CAPABILITY = (9, 0)
# Dynamic shared memory a block may take on sm_90: its 227 KiB less 1 KiB for the kernel's own
# (static) shared memory, 384-512 bytes.
MAX_SHARED_BYTES = 226 * 1024

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

// What is left of a row once its slice is in p (registers): max, exponentials and sum per warp,
// one exchange over the block and the cluster, and the scaled output written to yt. `n_here` is
// the slice's length in vectors; `whole` says this thread's vectors all lie in it. `parts_m` and
// `parts_s` take every block's (max, sum); `first` says no exchange has happened yet, so the
// cluster's blocks must be waited for before writing into them.
__device__ __forceinline__ void finish_slice(uint4 (&p)[VPT], bool whole, int n_here, uint4* yt,
                                             float* red_m, float* red_s, float* parts_m,
                                             float* parts_s, unsigned rank, bool first)
{
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
    if (first) cluster_wait();
    if (threadIdx.x < CLUSTER) {
        store_to_block(&parts_m[rank], threadIdx.x, m_all);
        store_to_block(&parts_s[rank], threadIdx.x, s_all);
    }
    cluster_barrier();
    combine(parts_m, parts_s, CLUSTER, m_all, s_all);
#endif
    // A warp whose values are all -inf writes 0 (its 2^(mw - m_all) could overflow).
    const float inv = s == 0.f ? 0.f : exp2f(mw - m_all) / s_all;
    #pragma unroll
    for (int u = 0; u < VPT; ++u) {
        if (whole || (int)threadIdx.x + u * THREADS < n_here) {
            uint4 o;
            o.x = scale_pair(p[u].x, inv);
            o.y = scale_pair(p[u].y, inv);
            o.z = scale_pair(p[u].z, inv);
            o.w = scale_pair(p[u].w, inv);
            __stcs(yt + u * THREADS, o);
        }
    }
}

#define NEG_INF4 make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u)

extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS softmax_resident_bf16(
    const uint4* __restrict__ x, uint4* __restrict__ y,
    long long stride_vx, long long stride_vy, long long n_vec_, long long slice_vec_)
{
    const int n_vec = (int)n_vec_, slice_vec = (int)slice_vec_;
    __shared__ float red_m[32];
    __shared__ float red_s[32];
    // Every block's (max, sum), written into each block by its owner (so no block reads
    // another's shared memory, and none has to wait for the others before it leaves).
    __shared__ float parts_m[CLUSTER], parts_s[CLUSTER];
#if CLUSTER > 1
    const unsigned rank = cluster_rank();
    cluster_arrive();
#else
    const unsigned rank = 0;
#endif
    const long long row = blockIdx.x / CLUSTER;
    const int v0 = (int)rank * slice_vec;
    const int n_here = min(slice_vec, n_vec - v0);

    // A thread whose vectors all lie in the slice (all but the last few) loads and stores
    // without a bounds check: kept predicates would cost a register per vector.
    const uint4* xt = x + row * stride_vx + v0 + threadIdx.x;
    const bool whole = (int)threadIdx.x + (VPT - 1) * THREADS < n_here;
    uint4 p[VPT];
    if (whole) {
        #pragma unroll
        for (int u = 0; u < VPT; ++u) p[u] = __ldcs(xt + u * THREADS);
    } else {
        #pragma unroll
        for (int u = 0; u < VPT; ++u) {
            p[u] = (int)threadIdx.x + u * THREADS < n_here ? __ldcs(xt + u * THREADS) : NEG_INF4;
        }
    }
    finish_slice(p, whole, n_here, y + row * stride_vy + v0 + threadIdx.x, red_m, red_s, parts_m,
                 parts_s, rank, true);
}

#if STAGES > 0
__device__ __forceinline__ unsigned smem_addr(const void* ptr) {
    return (unsigned)__cvta_generic_to_shared(ptr);
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred done;\n\t"
                 "WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT;\n\t}" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
// By one thread: `bytes` from global memory into shared memory through the copy engine (TMA),
// in pieces of at most 16 KiB, their arrival counted on `bar`.
__device__ __forceinline__ void fetch_slice(uint4* dst, const uint4* src, unsigned bytes,
                                            unsigned long long* bar) {
    const unsigned b = smem_addr(bar), d = smem_addr(dst);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(b), "r"(bytes) : "memory");
    for (unsigned off = 0; off < bytes; off += 16384u) {
        const unsigned n = min(16384u, bytes - off);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];"
                     :: "r"(d + off), "l"((const char*)src + off), "r"(n), "r"(b) : "memory");
    }
}

// A cluster takes `rows_per_cluster` consecutive rows; each block keeps the slices of the next
// STAGES rows in flight into shared memory (TMA) while it works on one in registers, so the
// block never waits on a whole HBM round trip between rows.
extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS softmax_pipelined_bf16(
    const uint4* __restrict__ x, uint4* __restrict__ y,
    long long stride_vx, long long stride_vy, long long n_vec_, long long slice_vec_,
    long long n_rows, long long rows_per_cluster)
{
    const int n_vec = (int)n_vec_, slice_vec = (int)slice_vec_;
    extern __shared__ __align__(128) uint4 staged[];  // STAGES slices of slice_vec vectors
    __shared__ __align__(8) unsigned long long full[STAGES];
    __shared__ float red_m[32];
    __shared__ float red_s[32];
    // Two sets, by row parity: a block may write the next row's (max, sum) into a block that
    // is still reading this row's.
    __shared__ float parts_m[2][CLUSTER], parts_s[2][CLUSTER];
#if CLUSTER > 1
    const unsigned rank = cluster_rank();
    cluster_arrive();
#else
    const unsigned rank = 0;
#endif
    const long long first = (blockIdx.x / CLUSTER) * rows_per_cluster;
    const long long last = min(first + rows_per_cluster, n_rows);
    const int v0 = (int)rank * slice_vec;
    const int n_here = min(slice_vec, n_vec - v0);
    const unsigned bytes = (unsigned)n_here * 16u;
    if (threadIdx.x == 0) {
        #pragma unroll
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        #pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (first + s < last) {
                fetch_slice(staged + s * slice_vec, x + (first + s) * stride_vx + v0, bytes,
                            &full[s]);
            }
        }
    }
    __syncthreads();
    const bool whole = (int)threadIdx.x + (VPT - 1) * THREADS < n_here;
    for (long long row = first; row < last; ++row) {
        const int it = (int)(row - first), s = it % STAGES;
        mbar_wait(&full[s], (unsigned)(it / STAGES) & 1u);
        const uint4* src = staged + s * slice_vec + threadIdx.x;
        uint4 p[VPT];
        if (whole) {
            #pragma unroll
            for (int u = 0; u < VPT; ++u) p[u] = src[u * THREADS];
        } else {
            #pragma unroll
            for (int u = 0; u < VPT; ++u) {
                p[u] = (int)threadIdx.x + u * THREADS < n_here ? src[u * THREADS] : NEG_INF4;
            }
        }
        __syncthreads();  // every thread holds its values: the stage may be refilled
        if (threadIdx.x == 0 && row + STAGES < last) {
            fetch_slice(staged + s * slice_vec, x + (row + STAGES) * stride_vx + v0, bytes,
                        &full[s]);
        }
        finish_slice(p, whole, n_here, y + row * stride_vy + v0 + threadIdx.x, red_m, red_s,
                     parts_m[it & 1], parts_s[it & 1], rank, it == 0);
    }
}
#endif
"""


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


@dataclass(frozen=True)
class Launch:
    """How a row of `n_vec` 16-byte vectors is split: blocks per row and vectors per thread;
    `stages` slices a block prefetches into shared memory (0: one row a cluster, no
    prefetch)."""

    cluster: int
    slice_vec: int
    vectors_per_thread: int
    stages: int = 0

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory a block needs for its prefetched slices."""
        return self.stages * self.slice_vec * 16


def plan(n_vec: int, threads: int, slice_kb: int, stages: int = 0) -> Launch:
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
    launch = Launch(cluster, slice_vec, vectors_per_thread, stages)
    if launch.shared_bytes > MAX_SHARED_BYTES:
        raise ValueError(
            f"{stages} prefetched slices of {slice_vec * 16 // 1024} KiB exceed the "
            f"{MAX_SHARED_BYTES // 1024} KiB of shared memory a block may take for them: use "
            "fewer stages or a smaller slice"
        )
    return launch


def compile_options(threads: int, launch: Launch) -> tuple[str, ...]:
    """NVRTC options for one launch shape (cluster > 1 and stages > 0 need sm_90). The block
    size is a compile-time constant so that each thread's vector offsets are immediates, not
    registers."""
    return (
        "--use_fast_math",
        f"-DTHREADS={threads}",
        f"-DVPT={launch.vectors_per_thread}",
        f"-DCLUSTER={launch.cluster}",
        f"-DSTAGES={launch.stages}",
    )


@functools.cache
def _compiled(threads: int, launch: Launch, device: int):
    """The kernel of one launch shape on `device`, which must be CuPy's current device: the
    shared-memory opt-in is set per device. Every prefetching launch opts in, since without it a
    launch fails past 48 KiB less the kernel's static shared memory."""
    name = "softmax_pipelined_bf16" if launch.stages else "softmax_resident_bf16"
    kern = cupy.RawKernel(SOURCE, name, options=compile_options(threads, launch))
    if launch.stages:
        kern.max_dynamic_shared_size_bytes = launch.shared_bytes
    return kern


def kernel(
    x: torch.Tensor,
    threads: int = 512,
    slice_kb: int = 64,
    stages: int = 0,
    rows_per_cluster: int = 4,
) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError("cupy_softmax_resident handles 2-D bfloat16 rows with unit column stride")
    if stages < 0 or rows_per_cluster < 1:
        raise ValueError("stages must be >= 0 and rows_per_cluster >= 1")
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    if n_cols % 8 or x.stride(0) % 8 or x.data_ptr() % 16 or y.data_ptr() % 16:
        raise ValueError("cupy_softmax_resident needs 16-byte aligned rows of 8k columns")
    if n_rows == 0 or n_cols == 0:
        return y
    launch = plan(n_cols // 8, threads, slice_kb, stages)
    needs_sm90 = launch.cluster > 1 or launch.stages > 0
    if needs_sm90 and torch.cuda.get_device_capability(x.device) < CLUSTER_MIN_CAPABILITY:
        raise ValueError("rows longer than slice_kb, or stages > 0, need sm_90 (clusters, TMA)")
    args = (x.data_ptr(), y.data_ptr(), x.stride(0) // 8, y.stride(0) // 8, n_cols // 8)
    stream = _TorchStream(torch.cuda.current_stream(x.device).cuda_stream)
    with cupy.cuda.Device(x.device.index):
        kern = _compiled(threads, launch, x.device.index)
        if launch.stages == 0:
            kern((n_rows * launch.cluster,), (threads,), (*args, launch.slice_vec), stream=stream)
        else:
            clusters = -(-n_rows // rows_per_cluster)
            kern(
                (clusters * launch.cluster,),
                (threads,),
                (*args, launch.slice_vec, n_rows, rows_per_cluster),
                stream=stream,
                shared_mem=launch.shared_bytes,
            )
    return y

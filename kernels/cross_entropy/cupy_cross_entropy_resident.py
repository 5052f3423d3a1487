"""Per-row cross-entropy in raw CUDA through CuPy, with each row's logits held in registers
and read once.

A row is split over a cluster of blocks (Hopper thread-block clusters; one block where the row
is short), the smallest power of two (at most 8) whose slices fit `slice_kb`, so that a decode
batch of 64 rows still fills the GPU. Each thread issues all of its 16-byte loads at once, then:
1. each warp takes the max of its values (on packed bfloat16 pairs) and the sum of
   2^(x log2(e) - its max), one exponential per element;
2. the warps' (max, sum) pairs are combined over the block, then over the cluster in one
   exchange: each block writes its pair into block 0's shared memory before one cluster
   barrier;
3. block 0 writes max + log(sum) - logits[target] (0 where the target is ignored).
With `early_exit` only warp 0 of each block takes part in the exchange's barrier, and only block
0 waits at it: the other warps leave after the first barrier, and the other blocks' warp 0
leaves once it has released its pair (a cluster barrier waits for the threads that have not
exited). Profiled at decode 64 x 128256 without it, 54 % of the warps' stall samples were
barrier and memory-barrier stalls, a quarter of all of them at the cluster barrier's wait; with
it the kernel was 0-2 % faster (docs/benchmarks/2026-11-30-h200-session14.md).
With `warp_pairs` (clusters only) no block combines its warps: each warp writes its (max, sum)
pair straight into block 0's shared memory, and every warp but block 0's warp 0 leaves once it
has released its pair; block 0's warp 0 waits at the one cluster barrier and combines the
cluster's pairs, several a lane. A row's end then takes no block barrier and one combine fewer
on its way to the loss (`early_exit` is then moot: every warp leaves early).
With `async_pairs` as well, each warp sends its pair with asynchronous stores (`st.async`) that
count their bytes in on a transaction barrier (mbarrier) in block 0: no warp fences its stores or
arrives at a second cluster barrier, and block 0's warp 0 waits on the barrier until every pair
has landed. With `redux_max` a warp's max is one `redux.sync` on the floats' bits mapped to
ints of the same order, not five shuffles.
Three more switches were timed at both decode shapes and won nothing, so they are gone: the warp
sums as `redux.sync` adds in fixed point, a 256-byte L2 fetch hint on the row's loads, and the
target's index and logit loaded before the row (docs/benchmarks/2026-12-01-h200-session30.md).
With `exchange="global"` a row's blocks are independent (no cluster to co-schedule, which on
the H200 cost a plain read of 16 MiB about 1 us, docs/benchmarks/2026-11-30-h200-session9.md):
each publishes its pair in global memory and counts itself in, and the last to arrive combines
the pairs, writes the loss and sets the row's count back to 0 (up to 32 blocks a row). The
counts live in one buffer per device, zeroed once, so no call pays a kernel to zero them; calls
on the same device must therefore not overlap (run them on one stream, as torch does by default).
Rows must be 16-byte aligned with a multiple of 8 columns, as every vocabulary of the task is.

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
    "exchange": ["cluster", "global"],
    "early_exit": [False, True],
    "warp_pairs": [False, True],
    "async_pairs": [False, True],
    "redux_max": [False, True],
}
EXCHANGES = ("cluster", "global")
MAX_CLUSTER = 8
MAX_GLOBAL_BLOCKS = 32
MAX_VECTORS_PER_THREAD = 32
CLUSTER_MIN_CAPABILITY = (9, 0)
IGNORE_INDEX = -100

SOURCE = r"""
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)
#define IGNORE_INDEX (-100LL)
#define LN2 0.6931471805599453f

__device__ __forceinline__ float bf_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned max_bf16x2(unsigned a, unsigned b) {
    unsigned r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
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
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
// The address of `p` (this block's shared memory) in block `rank` of this cluster.
__device__ __forceinline__ unsigned in_block(const void* p, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    return remote;
}
// Writes v into `slot` of block `rank` of this cluster (distributed shared memory).
__device__ __forceinline__ void store_to_block(float* slot, unsigned rank, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(in_block(slot, rank)), "f"(v)
                 : "memory");
}
#if ASYNC_PAIRS
// Writes v into `slot` of block `rank` and counts its 4 bytes in on that block's transaction
// barrier `bar`: the writer neither fences nor waits.
__device__ __forceinline__ void store_async_to_block(float* slot, unsigned rank, float v,
                                                     unsigned long long* bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                 :: "r"(in_block(slot, rank)), "f"(v), "r"(in_block(bar, rank)) : "memory");
}
// By one thread, before the cluster's first barrier: `bar` (one arrival) expects BYTES from
// the cluster's asynchronous stores, and every block may count into it once past that barrier.
template <unsigned BYTES>
__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bar)) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(bar)), "n"(BYTES) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Until `bar`'s phase PARITY completes; the other blocks' stores counted on it are then seen.
template <unsigned PARITY>
__device__ __forceinline__ void mbar_wait(unsigned long long* bar) {
    for (unsigned landed = 0; !landed;) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(landed) : "r"(smem_addr(bar)), "n"(PARITY) : "memory");
    }
}
#endif
#define CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#else
#define CLUSTER_DIMS
#endif

#if REDUX_MAX
// One redux instruction on the floats' bits mapped to ints of the same order (a negative
// float's magnitude bits flipped: the map is its own inverse); a positive NaN wins, where the
// shuffles' fmaxf drops it (a NaN logit makes its row's sum, so its loss, NaN either way).
__device__ __forceinline__ int flip_negative(int i) { return i >= 0 ? i : i ^ 0x7fffffff; }
__device__ __forceinline__ float warp_max(float v) {
    int r;
    asm volatile("redux.sync.max.s32 %0, %1, 0xffffffff;"
                 : "=r"(r) : "r"(flip_negative(__float_as_int(v))));
    return __int_as_float(flip_negative(r));
}
#else
__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
#endif
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

#if CLUSTER > 1 && WARP_PAIRS
// combine() over n pairs, more than a warp's lanes: each lane first combines pairs lane,
// lane + 32, ... against their own max.
template <int N>
__device__ __forceinline__ void combine_strided(const float* ms, const float* ss, float& m,
                                                float& s) {
    const int lane = threadIdx.x & 31;
    float ml = NEG_INF;
    #pragma unroll
    for (int i = lane; i < N; i += 32) ml = ss[i] == 0.f ? ml : fmaxf(ml, ms[i]);
    float sl = 0.f;
    #pragma unroll
    for (int i = lane; i < N; i += 32) sl += weigh(ss[i], ms[i], ml);
    m = warp_max(ml);
    s = warp_sum(weigh(sl, ml, m));
}
#endif

// BLOCKS blocks take a row: a cluster of them (CLUSTER == BLOCKS), or, with CLUSTER 1 and
// BLOCKS > 1, independent blocks that meet through global memory (GLOBAL_EXCHANGE).
#define GLOBAL_EXCHANGE (CLUSTER == 1 && BLOCKS > 1)
#define WARPS (THREADS / 32)
#define PAIRS (WARP_PAIRS ? CLUSTER * WARPS : CLUSTER)
#if GLOBAL_EXCHANGE && BLOCKS > 32
#error "a global exchange combines one pair a lane: at most 32 blocks a row"
#endif

extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS cross_entropy_resident_bf16(
    const uint4* __restrict__ x, const long long* __restrict__ targets, float* __restrict__ loss,
    long long stride_vx, long long n_vec_, long long slice_vec_, float2* __restrict__ partial,
    unsigned* __restrict__ arrived)
{
    const int n_vec = (int)n_vec_, slice_vec = (int)slice_vec_;
    __shared__ float red_m[32];
    __shared__ float red_s[32];
#if CLUSTER > 1
    // Every block's (max, sum), or with WARP_PAIRS every warp's, written into block 0 by its
    // owner (so no block reads another's shared memory, and none waits to leave).
    __shared__ float parts_m[PAIRS], parts_s[PAIRS];
    const unsigned rank = cluster_rank();
#if ASYNC_PAIRS
    // Block 0's: its phase completes once every warp's pair (8 bytes) has landed.
    __shared__ __align__(8) unsigned long long pairs_in;
    if (rank == 0 && threadIdx.x == 0) mbar_init<PAIRS * 8>(&pairs_in);
#endif
    cluster_arrive();
#else
    const unsigned rank = blockIdx.x % BLOCKS;
#endif
    const long long row = blockIdx.x / BLOCKS;
    const uint4* xv = x + row * stride_vx;
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

    // The target's logit, fetched while the row's loads are in flight (by the thread that
    // writes the loss: with a global exchange, whichever block of the row finishes last).
    long long target = 0;
    float picked = 0.f;
    if ((GLOBAL_EXCHANGE || rank == 0) && threadIdx.x == 0) {
        target = targets[row];
        if (target >= 0 && target < (long long)n_vec * 8)
            picked = bf_lo(reinterpret_cast<const unsigned short*>(xv)[target]);
    }

    // Each warp takes its own max (on packed pairs) and sums 2^(x log2(e) - its max) at once:
    // the block's and the cluster's max only rescale the sums.
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
        const unsigned w[4] = {p[u].x, p[u].y, p[u].z, p[u].w};
        #pragma unroll
        for (int k = 0; k < 4; ++k)
            s += exp2f(fmaf(bf_lo(w[k]), LOG2E, -mw)) + exp2f(fmaf(bf_hi(w[k]), LOG2E, -mw));
    }
    s = warp_sum(s);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if CLUSTER > 1 && WARP_PAIRS
    // Each warp hands its pair to block 0 and leaves, but block 0's warp 0, which waits for
    // them all (the release orders the pair before the arrival it is read after).
    cluster_wait();
#if ASYNC_PAIRS
    // Asynchronous stores counted in on block 0's barrier: no release, no second cluster
    // barrier; block 0's warp 0 waits for the bytes alone.
    if (lane == 0) {
        store_async_to_block(&parts_m[rank * WARPS + warp], 0, mw, &pairs_in);
        store_async_to_block(&parts_s[rank * WARPS + warp], 0, s, &pairs_in);
    }
    if (rank != 0 || warp != 0) return;
    mbar_wait<0>(&pairs_in);
#else
    if (lane == 0) {
        store_to_block(&parts_m[rank * WARPS + warp], 0, mw);
        store_to_block(&parts_s[rank * WARPS + warp], 0, s);
    }
    __syncwarp();  // the aligned barrier below needs the whole warp converged
    if (rank != 0 || warp != 0) {
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
        return;
    }
    cluster_barrier();
#endif
    float m_all, s_all;
    combine_strided<PAIRS>(parts_m, parts_s, m_all, s_all);
#else
    if (lane == 0) { red_m[warp] = mw; red_s[warp] = s; }
    __syncthreads();
    float m_all = 0.f, s_all = 0.f;
    if (warp == 0) combine(red_m, red_s, THREADS >> 5, m_all, s_all);
#if CLUSTER > 1
    // Every thread takes part in the cluster barriers; only warp 0 of block 0 goes on. With
    // EARLY_EXIT only warp 0 of each block takes part in the second one (a cluster barrier
    // waits for the threads that have not exited), and only block 0 waits at it: the other
    // blocks' warp 0 leaves once its pair is released to block 0.
    cluster_wait();
    if (EARLY_EXIT && warp != 0) return;
    if (threadIdx.x == 0) {
        store_to_block(&parts_m[rank], 0, m_all);
        store_to_block(&parts_s[rank], 0, s_all);
    }
    if (EARLY_EXIT) {
        __syncwarp();  // the aligned barrier below needs the whole warp converged
        if (rank != 0) {
            asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
            return;
        }
    }
    cluster_barrier();
    if (rank != 0 || warp != 0) return;
    combine(parts_m, parts_s, CLUSTER, m_all, s_all);
#elif GLOBAL_EXCHANGE
    // Each block publishes its (max, sum) and counts itself in (the counts start at 0); the
    // last of the row to arrive combines them, one a lane, and writes the loss.
    // Lane 0's fences order its publish before its count, and the others' pairs before the
    // last block's reads; __syncwarp passes that order on to the warp's other lanes.
    if (warp != 0) return;
    unsigned last = 0;
    if (lane == 0) {
        partial[blockIdx.x] = make_float2(m_all, s_all);
        __threadfence();
        last = atomicAdd(&arrived[row], 1u) == BLOCKS - 1;
        if (last) __threadfence();
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    __syncwarp();
    if (!last) return;
    const float2 q = lane < BLOCKS ? __ldcg(&partial[row * BLOCKS + lane])
                                   : make_float2(NEG_INF, 0.f);
    const float mi = q.y == 0.f ? NEG_INF : q.x;
    m_all = warp_max(mi);
    s_all = warp_sum(weigh(q.y, mi, m_all));
    if (lane == 0) arrived[row] = 0;  // every block of the row has counted itself in
#else
    if (warp != 0) return;
#endif
#endif  // WARP_PAIRS
    if (lane == 0) {
        float out;
        if (target == IGNORE_INDEX) out = 0.f;
        else if (target < 0 || target >= (long long)n_vec * 8) out = __int_as_float(0x7fc00000);
        else out = (m_all + log2f(s_all)) * LN2 - picked;  // NaN above: not a class
        loss[row] = out;
    }
}
"""


@dataclass(frozen=True)
class _TorchStream:
    """What CuPy's launcher reads from a stream: its handle."""

    ptr: int


@dataclass(frozen=True)
class Launch:
    """How a row of `n_vec` 16-byte vectors is split: blocks per row, vectors per thread, and
    how the row's blocks meet ("cluster": a thread-block cluster; "global": through global
    memory, the last block to finish combining)."""

    blocks: int
    slice_vec: int
    vectors_per_thread: int
    exchange: str = "cluster"

    @property
    def cluster(self) -> int:
        """The thread-block cluster size (1: no cluster)."""
        return self.blocks if self.exchange == "cluster" else 1


def plan(n_vec: int, threads: int, slice_kb: int, exchange: str = "cluster") -> Launch:
    """The fewest blocks (a power of two) whose slices fit `slice_kb`, capped at MAX_CLUSTER
    blocks in a cluster and at MAX_GLOBAL_BLOCKS (a warp's lanes) with a global exchange."""
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    cap = MAX_CLUSTER if exchange == "cluster" else MAX_GLOBAL_BLOCKS
    blocks = 1
    while blocks < cap and n_vec * 16 > blocks * slice_kb * 1024:
        blocks *= 2
    slice_vec = max(1, -(-n_vec // blocks))
    vectors_per_thread = -(-slice_vec // threads)
    if vectors_per_thread > MAX_VECTORS_PER_THREAD:
        raise ValueError(
            f"a {n_vec * 16 // 1024} KiB row over {blocks} blocks of {threads} threads needs "
            f"{vectors_per_thread} vectors per thread (at most {MAX_VECTORS_PER_THREAD}): "
            "use more threads"
        )
    # One block a row exchanges nothing: the same launch whichever way is asked for.
    return Launch(blocks, slice_vec, vectors_per_thread, exchange if blocks > 1 else "cluster")


# The kernel's compile-time switches: PARAMS' on/off entries, as kernel() names them too; NVRTC
# gets each as the macro of its name in capitals, 0 or 1.
SWITCHES = tuple(name for name, values in PARAMS.items() if values == [False, True])


def compile_options(threads: int, launch: Launch, **switches: bool) -> tuple[str, ...]:
    """NVRTC options for one launch shape (cluster > 1 needs sm_90) and SWITCHES (absent ones
    off): the exchange (EARLY_EXIT, WARP_PAIRS, ASYNC_PAIRS) and the warp max
    (REDUX_MAX: redux needs sm_80). The block size is a compile-time constant so that each thread's
    vector offsets are immediates, not registers."""
    unknown = sorted(set(switches) - set(SWITCHES))
    if unknown:
        raise TypeError(f"unknown switches {unknown}; the kernel has {SWITCHES}")
    return (
        "--use_fast_math",
        f"-DTHREADS={threads}",
        f"-DVPT={launch.vectors_per_thread}",
        f"-DBLOCKS={launch.blocks}",
        f"-DCLUSTER={launch.cluster}",
        *(f"-D{name.upper()}={int(switches.get(name, False))}" for name in SWITCHES),
    )


# The global exchange's per-row arrival counts, per device: zero between calls (the last block
# of a row resets its count). Every buffer is kept, as a CUDA graph may hold any of them.
_ARRIVALS: dict[int, list[torch.Tensor]] = {}
MIN_ARRIVAL_ROWS = 16384


def _arrival_counts(n_rows: int, device: torch.device) -> torch.Tensor:
    held = _ARRIVALS.setdefault(device.index, [])
    if held and held[-1].numel() >= n_rows:
        return held[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A buffer made while a graph is captured is zeroed only when the graph replays: this
        # call's graph zeroes its own counts, and no other call shares them.
        return torch.zeros(n_rows, dtype=torch.int32, device=device)
    rows = max(n_rows, MIN_ARRIVAL_ROWS, 2 * held[-1].numel() if held else 0)
    held.append(torch.zeros(rows, dtype=torch.int32, device=device))
    return held[-1]


@functools.cache
def _compiled(threads: int, launch: Launch, **options: bool):
    return cupy.RawKernel(
        SOURCE, "cross_entropy_resident_bf16", options=compile_options(threads, launch, **options)
    )


def kernel(
    logits: torch.Tensor,
    targets: torch.Tensor,
    threads: int = 512,
    slice_kb: int = 64,
    exchange: str = "cluster",
    early_exit: bool = False,
    warp_pairs: bool = False,
    async_pairs: bool = False,
    redux_max: bool = False,
) -> torch.Tensor:
    x = logits
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError("cupy_cross_entropy_resident handles 2-D bfloat16 logits, unit stride")
    n_rows, n_cols = x.shape
    if targets.dtype != torch.int64 or targets.shape != (n_rows,):
        raise ValueError("targets must be int64 of shape (rows,)")
    if targets.device != x.device:
        raise ValueError(f"targets are on {targets.device}, the logits on {x.device}")
    targets = targets.contiguous()
    loss = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_cols % 8 or x.stride(0) % 8 or x.data_ptr() % 16:
        raise ValueError("cupy_cross_entropy_resident needs 16-byte aligned rows of 8k columns")
    if n_rows == 0:
        return loss
    if n_cols == 0:
        raise ValueError("cross-entropy over an empty vocabulary is undefined")
    launch = plan(n_cols // 8, threads, slice_kb, exchange)
    warp_pairs = warp_pairs and launch.cluster > 1  # only a cluster takes warps' pairs
    # no cluster barrier to leave early; with warp_pairs every warp leaves early
    early_exit = early_exit and launch.cluster > 1 and not warp_pairs
    async_pairs = async_pairs and warp_pairs  # the warps' pairs, sent asynchronously
    if launch.cluster > 1 and torch.cuda.get_device_capability(x.device) < CLUSTER_MIN_CAPABILITY:
        raise ValueError("rows longer than slice_kb need thread-block clusters (sm_90)")
    partial = arrived = None
    if launch.blocks > 1 and launch.cluster == 1:
        partial = torch.empty((n_rows * launch.blocks, 2), dtype=torch.float32, device=x.device)
        arrived = _arrival_counts(n_rows, x.device)
    kern = _compiled(
        threads,
        launch,
        early_exit=early_exit,
        warp_pairs=warp_pairs,
        async_pairs=async_pairs,
        redux_max=redux_max,
    )
    kern(
        (n_rows * launch.blocks,),
        (threads,),
        (
            x.data_ptr(),
            targets.data_ptr(),
            loss.data_ptr(),
            x.stride(0) // 8,
            n_cols // 8,
            launch.slice_vec,
            *(0 if t is None else t.data_ptr() for t in (partial, arrived)),
        ),
        stream=_TorchStream(torch.cuda.current_stream(x.device).cuda_stream),
    )
    return loss

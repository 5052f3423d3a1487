"""MLA decode and its value projection for Hopper (sm_90a): the split kernel of
gluon_mla_decode_value.py written in CUDA C++ (torch's load_inline, inline PTX for TMA, mbarriers
and wgmma), with a schedule the Gluon kernel cannot write, then the same Triton kernel that
merges a head's splits and multiplies by its W_UV.

A CTA takes 64 heads of one sequence over one split of the cache, in tiles of `block_n` rows
(32, or 64 where the scores read Q from shared memory half as often): Q (64 x 576, 72 KiB) stays
in shared memory, the tiles stream through a ring of `num_stages` slots (4 of 36 KiB or 2 of 72
KiB) that one thread of a third warpgroup fills by TMA, in the 128-byte swizzle wgmma reads.
Two consumer warpgroups each own 256 of the 512 output columns (128 fp32 registers a thread)
and compute the scores of every other tile: the owner of tile t turns S_t into probabilities P_t
(bf16), publishes them, transposed, in the slot's rope chunk (which only S_t reads) with their
row maxima and sums, and multiplies its half of the values with P_t from its registers; the
other warpgroup rescales its half by the published maxima and multiplies with P_t from shared
memory. A warpgroup takes the other's tile t and its own tile t + 1 together:

    wait P_{t-1} V, give back its half of slot t - 1 -> issue S_{t+1} -> wait P_t published and
    S_{t+1} -> softmax of S_{t+1} on P_t's maxima, publish P_{t+1} -> rescale O, issue P_t V ->
    wait it, give back its half of slot t -> rescale O, issue P_{t+1} V

so the chain from one warpgroup's publication to the other's is the softmax alone, S_{t+1} runs
while P_t is awaited, and one warpgroup's softmax runs beside the other's products (the Gluon
kernel's owner computes the other tile's value product before its own softmax). Each warpgroup
gives back the half of a slot its products read (its 256 latent columns), and the loader fills
a tile in two groups: the non-owner's half, given back first, then the owner's half and the rope
(which holds P^T too, so waits for both); the owner's scores read the chunks in that order. The
loader warpgroup gives its registers to the consumers (setmaxnreg).

With `values_between`, a warpgroup issues the other's product between the two groups of its
scores:

    wait P_{t-1} V, give back its half of slot t - 1 -> issue S_{t+1}'s first group -> wait P_t
    published, rescale O, issue P_t V -> issue S_{t+1}'s second group -> wait all, give back its
    half of slot t -> softmax of S_{t+1}, publish P_{t+1} -> rescale O, issue P_{t+1} V

In a ring of two, slot t + 1 is slot t - 1, and the second group (the owner's half) is loaded
only once P_{t-1} V has given that half back: without it, the scores wait for that load with
nothing else issued. The price: P_{t+1} is published after P_t V and the second group, so the
chain from one warpgroup's publication to the other's is no longer the softmax alone.

Launched on torch's current stream (CUDA graphs capture it) with programmatic dependent launch:
every warpgroup waits for the kernel before it (griddepcontrol.wait) before it reads an input
or writes a partial, and the loader then lets the merge launch, which waits in turn. Partials
as the Gluon kernel lays them out: part_o (sequence, head, split) rows of 512 fp32, normalised,
and part_lse their log2-sum-exp. The merge kernel is the Gluon candidate's, copied (a candidate
imports no other). bf16 on sm_90 only, heads a multiple of 64, rank 512, rope 64, v_head_dim
128, a cache length a multiple of block_n; anything else is a ValueError naming what. Builds with
CUDA 12.5 or later (cudaGetDriverEntryPointByVersion finds cuTensorMapEncodeTiled)."""

import functools
import math

import torch
import torch.utils.cpp_extension
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

LANGUAGE = "cuda"
PARAMS = {
    "block_n": [32, 64],
    "num_stages": [2, 4],
    "values_between": [False, True],
    "block_m": [1, 16],
    "block_k": [32, 64, 128],
    "merge_warps": [4, 8],
    "merge_stages": [1, 2, 3, 4],
    "column_slices": [1, 2, 4, 8],
}

LOG2E = 1.4426950408889634
SCALE_DIM = 192
RANK = 512
ROPE = 64
HEADS = 64  # a CTA's heads: one wgmma is 64 rows tall
# The split kernel's builds: (cache rows a tile, slots in the ring). 64-row tiles fit two slots.
# Rings of an even number of slots only: the tile a slot takes next then has the previous one's
# owner, so the loader's first group, which waits for the other warpgroup's half alone, is armed
# again only after that warpgroup too has waited for it (an odd ring can complete its phase
# twice before the other warpgroup waits, which then waits forever).
BUILDS = ((32, 4), (64, 2))
V_DIM = 128
MAX_SPLITS = 128  # the splits a merge program reads in one step

CUDA_SRC = r"""
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdexcept>
#include <string>

// Shared memory, from a 1024-byte aligned base: Q (9 chunks of 64 rows x 128 bytes: latent
// columns 64c..64c+63, then the rope), the ring (STAGES slots of 9 chunks of TILE rows x 128
// bytes), the published row maxima and sums (2 x 64 floats a slot), then the mbarriers: Q's,
// then five a slot (BarKind's five kinds). Every chunk is TMA's 128-byte swizzle: in each
// 8-row x 128-byte atom the 16-byte unit u of row r at unit u ^ (r % 8).
constexpr int ROWS = 64;
constexpr int CHUNKS = 9;
constexpr int Q_CHUNK = ROWS * 128;
constexpr int Q_BYTES = CHUNKS * Q_CHUNK;
constexpr int OUT_COLS = 512;
constexpr int HALF = 256;  // a consumer warpgroup's output columns

// A build: tiles of TILE cache rows (32 or 64) in a ring of STAGES slots; BETWEEN, the other
// warpgroup's tile's value product issued between the two groups of a warpgroup's scores.
template <int TILE_, int STAGES_, bool BETWEEN_>
struct Layout {
    static constexpr int TILE = TILE_, STAGES = STAGES_;
    static constexpr bool BETWEEN = BETWEEN_;
    static constexpr int chunk = TILE * 128;
    static constexpr int slot = CHUNKS * chunk;
    static constexpr int ring = Q_BYTES;
    static constexpr int stats = ring + STAGES * slot;
    static constexpr int bars = stats + STAGES * 2 * ROWS * 4;
    static constexpr int bytes = bars + (1 + 5 * STAGES) * 8 + 1024;  // + the alignment
};

// The slots' mbarriers after Q's, a kind's STAGES together: a tile's first and second group of
// chunks loaded, its left (warpgroup 0's) and right (warpgroup 1's) half given back, its
// probabilities published.
enum BarKind { LOADED_FIRST, LOADED_SECOND, FREE_LEFT, FREE_RIGHT, PUBLISHED, BAR_KINDS };
__device__ __forceinline__ uint32_t bar_addr(uint32_t bars, int kind, int slot, int stages) {
    return bars + 8 * (1 + kind * stages + slot);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// griddepcontrol (programmatic dependent launch).
__device__ __forceinline__ void gdc_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void gdc_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// mbarriers (PTX ISA 9.7.13.15).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
// Until the phase of parity `parity` has completed (a fresh barrier passes parity 1 at once).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// A box of the 2-D tensor map at (x: column, y: row) into shared memory, counted on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int x, int y,
                                         uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// wgmma (PTX ISA 9.7.15). Descriptor: start, LBO, SBO as (x & 0x3FFFF) >> 4 in bits 0-13,
// 16-29, 32-45, swizzle mode 1 (128B) in bits 62-63. K-major operands: LBO 16 (unused), SBO
// 1024 (8 rows of 128 bytes); MN-major ones: LBO the next 64 columns (the next chunk), SBO 1024.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across a wait.
template <int NREG>
__device__ __forceinline__ void acc_fence(float* d) {
#pragma unroll
    for (int i = 0; i < NREG; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

@WGMMA@

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// S = Q K^T of a tile warpgroup W owns, in the slot at k0 (m64nTILEk16 over 576 columns, both
// K-major): step i of chunk c starts at byte 32 i of the chunk's first row. The chunks in the
// order they are loaded: the other warpgroup's half of the values (given back first), once
// `first` completes (issue_scores_first), then W's half and the rope once `second` does
// (issue_scores_second). Issued, not committed.
template <class L, int W>
__device__ __forceinline__ void issue_scores_first(float (&s)[L::TILE / 2], uint32_t q0,
                                                   uint32_t k0, uint32_t first, uint32_t parity) {
    mbar_wait(first, parity);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 16; ++ks) {  // the first step overwrites S (scale-d 0)
        const int c = 4 * (1 - W) + ks / 4;
        const uint32_t col = (ks % 4) * 32;
        wgmma_ss(s, desc(q0 + c * Q_CHUNK + col, 16, 1024),
                 desc(k0 + c * L::chunk + col, 16, 1024), ks > 0);
    }
}
template <class L, int W>
__device__ __forceinline__ void issue_scores_second(float (&s)[L::TILE / 2], uint32_t q0,
                                                    uint32_t k0, uint32_t second,
                                                    uint32_t parity) {
    mbar_wait(second, parity);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 20; ++ks) {
        const int c = ks < 16 ? 4 * W + ks / 4 : CHUNKS - 1;
        const uint32_t col = (ks % 4) * 32;
        wgmma_ss(s, desc(q0 + c * Q_CHUNK + col, 16, 1024),
                 desc(k0 + c * L::chunk + col, 16, 1024));
    }
}
// Both groups, committed together.
template <class L, int W>
__device__ __forceinline__ void issue_scores(float (&s)[L::TILE / 2], uint32_t q0, uint32_t k0,
                                             uint32_t first, uint32_t second, uint32_t parity) {
    issue_scores_first<L, W>(s, q0, k0, first, parity);
    issue_scores_second<L, W>(s, q0, k0, second, parity);
    wg_commit();
}

// Accumulator layout of m64nNk16: warp w holds rows 16w + lane / 4 (r0) and r0 + 8; for each
// 8-column group j, d[4j], d[4j + 1] at row r0, columns 8j + 2 (lane % 4), +1, and d[4j + 2],
// d[4j + 3] at row r0 + 8.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// O's rows times their factors, the products settled in their registers before the next
// wgmma.fence (ptxas serialises every wgmma if a move lands between the fence and them).
__device__ __forceinline__ void scale_rows(float (&o)[128], float a0, float a1) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0;
        o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1;
        o[4 * j + 3] *= a1;
    }
    acc_fence<128>(o);
}

template <class L>
struct Consumer {
    uint32_t q0, ring, bars;
    float* stats;
    int half;
    int r0, lane;

    __device__ uint32_t slot_addr(int t) const { return ring + (t % L::STAGES) * L::slot; }
    __device__ uint32_t bar(int kind, int t) const {
        return bar_addr(bars, kind, t % L::STAGES, L::STAGES);
    }
    __device__ uint32_t parity(int t) const { return (t / L::STAGES) & 1; }
    __device__ float* stat(int t, int which) const {
        return stats + ((t % L::STAGES) * 2 + which) * ROWS;
    }
    // One arrival a warp (four a half) once the warp is done with its half of tile t's slot.
    __device__ void release(int t) const {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar(FREE_LEFT + half, t));
    }
    // O += P V over this warpgroup's four latent chunks of tile t's slot (V MN-major).
    __device__ uint64_t v_desc(int t, int ks) const {
        return desc(slot_addr(t) + half * 4 * L::chunk + ks * 16 * 128, L::chunk, 1024);
    }
};

// P^T (positions x heads, heads contiguous) of a 64 x TILE tile into its rope chunk at byte
// 128 k + 16 ((m / 8) ^ (k % 8)) + 2 (m % 8): an MN-major A operand for the other warpgroup. A
// thread's values sit at k % 8 = 2 (lane % 4) + (e & 1) whatever the column group j (k = 8 j +
// ...), so four offsets (rows r0 and r0 + 8, e & 1) and 1024 j bytes place all TILE / 2.
template <int TILE>
__device__ __forceinline__ void store_p_transposed(const float (&p)[TILE / 2], unsigned char* sp,
                                                   int r0, int lane) {
    int at[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int m = r0 + (e >= 2 ? 8 : 0), k = 2 * (lane % 4) + (e & 1);
        at[e] = k * 128 + (((m / 8) ^ k) << 4) + (m % 8) * 2;
    }
#pragma unroll
    for (int j = 0; j < TILE / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            *(__nv_bfloat16*)(sp + 1024 * j + at[e]) = __float2bfloat16_rn(p[4 * j + e]);
        }
    }
}

// A consumer warpgroup, W = 0 or 1 (its output columns 256 W .. 256 W + 255; its tiles W, W + 2,
// ...), in the order the module's docstring gives.
//
// One instance a warpgroup, not one with W a variable: the two start differently, and where
// their paths met, the registers of the products in flight would be copied. Every wait count is
// a constant and the loop turns with one group in flight on every path into it: otherwise
// ptxas cannot follow the pipeline and serialises every wgmma.
template <class L, int W>
__device__ __forceinline__ void consume(uint32_t q0, uint32_t ring, uint32_t bars, float* stats,
                                        int n_tiles, float scale_log2,
                                        float* __restrict__ part_o, float* __restrict__ part_lse,
                                        int q_row, int split, int n_splits) {
    constexpr int TILE = L::TILE, NS = TILE / 2;  // NS: S's registers a thread
    const int lane = (int)threadIdx.x % 32;
    Consumer<L> c{q0, ring, bars, stats, W, 16 * ((int)threadIdx.x % 128 / 32) + lane / 4, lane};
    float o[128], s[NS];
    uint32_t a[TILE / 16][4];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] = 0.f;
    acc_fence<128>(o);  // zeroed here, not sunk past the first products
    acc_fence<NS>(s);
    // O's running row maxima (log2 units) and sums, for rows r0 and r0 + 8.
    float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.f, l1 = 0.f;

    // O's rows onto the maxima (mn0, mn1) of a tile whose probabilities sum to (rs0, rs1).
    auto absorb = [&](float mn0, float mn1, float rs0, float rs1) {
        const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        l0 = l0 * a0 + rs0;
        l1 = l1 * a1 + rs1;
        scale_rows(o, a0, a1);
    };

    // Tile t's published maxima and sums, once its probabilities are.
    float tm0, tm1, trs0, trs1;
    auto take = [&](int t) {
        mbar_wait(c.bar(LOADED_FIRST, t), c.parity(t));
        mbar_wait(c.bar(LOADED_SECOND, t), c.parity(t));
        mbar_wait(c.bar(PUBLISHED, t), c.parity(t));
        tm0 = c.stat(t, 0)[c.r0];
        tm1 = c.stat(t, 0)[c.r0 + 8];
        trs0 = c.stat(t, 1)[c.r0];
        trs1 = c.stat(t, 1)[c.r0 + 8];
    };

    // The softmax of S_t (done) over the maxima so far (b0, b1): P_t into the slot's rope chunk
    // and registers (a), its maxima and sums into the slot's stats (and sm*, srs*), published.
    float sm0, sm1, srs0, srs1;
    auto softmax = [&](int t, float b0, float b1) {
        acc_fence<NS>(s);
        float x0 = s[0], x1 = s[2];
#pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {
            x0 = fmaxf(x0, fmaxf(s[4 * j], s[4 * j + 1]));
            x1 = fmaxf(x1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
        sm0 = fmaxf(b0, quad_max(x0) * scale_log2);
        sm1 = fmaxf(b1, quad_max(x1) * scale_log2);
        float p[NS], rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float mn = e < 2 ? sm0 : sm1;
                p[4 * j + e] = __bfloat162float(
                    __float2bfloat16_rn(exp2f(s[4 * j + e] * scale_log2 - mn)));
            }
            rs0 += p[4 * j] + p[4 * j + 1];
            rs1 += p[4 * j + 2] + p[4 * j + 3];
        }
        srs0 = quad_sum(rs0);
        srs1 = quad_sum(rs1);
        unsigned char* sp = (unsigned char*)__cvta_shared_to_generic(c.slot_addr(t)) +
                            (CHUNKS - 1) * L::chunk;
        store_p_transposed<TILE>(p, sp, c.r0, lane);
        if (lane % 4 == 0) {
            c.stat(t, 0)[c.r0] = sm0;
            c.stat(t, 0)[c.r0 + 8] = sm1;
            c.stat(t, 1)[c.r0] = srs0;
            c.stat(t, 1)[c.r0 + 8] = srs1;
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        mbar_arrive(c.bar(PUBLISHED, t));
#pragma unroll
        for (int k = 0; k < TILE / 16; ++k) {
#pragma unroll
            for (int r = 0; r < 4; ++r) a[k][r] = pack_bf16(p[8 * k + 2 * r], p[8 * k + 2 * r + 1]);
        }
    };

    // O += P_t V over this warpgroup's half, P_t from the slot's rope chunk (the other
    // warpgroup's tile) or from registers (its own), committed.
    auto values_other = [&](int t) {
        const uint32_t p0 = c.slot_addr(t) + (CHUNKS - 1) * L::chunk;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < TILE / 16; ++ks) {
            wgmma_ss_tt(o, desc(p0 + ks * 16 * 128, L::chunk, 1024), c.v_desc(t, ks));
        }
        wg_commit();
    };
    auto values_own = [&](int t) {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < TILE / 16; ++ks) wgmma_rs_t(o, a[ks], c.v_desc(t, ks));
        wg_commit();
    };

    // Every product done, and tile t's slot (if any) given back.
    auto drain = [&](int t) {
        wg_wait0();
        acc_fence<128>(o);
        if (t >= 0) c.release(t);
    };

    // This warpgroup's half of the split's normalised output, and (warpgroup 0) the rows'
    // log2-sum-exp: rows (sequence, head, split).
    auto finish = [&]() {
        wg_wait0();
        acc_fence<128>(o);
        const long long row0 = (long long)(q_row + c.r0) * n_splits + split;
        const long long row1 = row0 + 8ll * n_splits;
        const float inv0 = 1.f / l0, inv1 = 1.f / l1;
        float* out0 = part_o + row0 * OUT_COLS + W * HALF + 2 * (lane % 4);
        float* out1 = part_o + row1 * OUT_COLS + W * HALF + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            *(float2*)(out0 + 8 * j) = make_float2(o[4 * j] * inv0, o[4 * j + 1] * inv0);
            *(float2*)(out1 + 8 * j) = make_float2(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
        }
        if (W == 0 && lane % 4 == 0) {
            part_lse[row0] = m0 + log2f(l0);
            part_lse[row1] = m1 + log2f(l1);
        }
    };

    mbar_wait(bars, 0);
    int t = W;
    // In flight where the loop turns: P_{t-1} V (own; or an empty group). Waited for before
    // S_{t+1} is issued: with wait_group 1 after S_{t+1}, ptxas serialises every wgmma.
    if (W == 0) {
        issue_scores<L, W>(s, c.q0, c.slot_addr(0), c.bar(LOADED_FIRST, 0),
                           c.bar(LOADED_SECOND, 0), c.parity(0));
        drain(-1);
        softmax(0, -CUDART_INF_F, -CUDART_INF_F);
        absorb(sm0, sm1, srs0, srs1);
        values_own(0);
        t = 1;  // the loop takes tiles 1 (other) and 2 (own), ...
    } else {
        wg_commit();
        t = 0;  // tiles 0 (other) and 1 (own), ...
    }
#pragma unroll 1
    for (; t + 1 < n_tiles; t += 2) {
        drain(t - 1);  // P_{t-1} V
        if constexpr (L::BETWEEN) {
            // In a ring of two the own half of slot t + 1 is loaded after P_{t-1} V, just given
            // back: P_t V runs while it is, and P_{t+1} is published after both.
            issue_scores_first<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_FIRST, t + 1),
                                     c.parity(t + 1));
            wg_commit();
            take(t);
            absorb(tm0, tm1, trs0, trs1);
            values_other(t);
            issue_scores_second<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_SECOND, t + 1),
                                      c.parity(t + 1));
            wg_commit();
            drain(t);  // S_{t+1} and P_t V
            softmax(t + 1, m0, m1);
        } else {
            // S_{t+1} while P_t is awaited
            issue_scores<L, W>(s, c.q0, c.slot_addr(t + 1), c.bar(LOADED_FIRST, t + 1),
                               c.bar(LOADED_SECOND, t + 1), c.parity(t + 1));
            take(t);
            drain(-1);  // S_{t+1}
            softmax(t + 1, tm0, tm1);
            absorb(tm0, tm1, trs0, trs1);
            values_other(t);
            drain(t);
        }
        absorb(sm0, sm1, srs0, srs1);
        values_own(t + 1);
    }
    if (t < n_tiles) {  // the other warpgroup's last tile
        take(t);
        drain(t - 1);
        absorb(tm0, tm1, trs0, trs1);
        values_other(t);
    }
    finish();
}

template <class L>
__global__ void __launch_bounds__(384, 1)
    mla_split_kernel(const __grid_constant__ CUtensorMap qn_map,
                     const __grid_constant__ CUtensorMap qp_map,
                     const __grid_constant__ CUtensorMap c_map,
                     const __grid_constant__ CUtensorMap p_map, float* __restrict__ part_o,
                     float* __restrict__ part_lse, int heads, int kv_len, int tiles_per_split,
                     float scale_log2) {
    constexpr int TILE = L::TILE, STAGES = L::STAGES;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* base = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const int head_blocks = heads / ROWS;
    const int seq = blockIdx.x / head_blocks;
    const int q_row = seq * heads + (blockIdx.x % head_blocks) * ROWS;
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int first_tile = split * tiles_per_split;
    const int n_tiles = min(tiles_per_split, kv_len / TILE - first_tile);
    const uint32_t bars = smem_u32(base + L::bars);  // Q's, then as bar_addr numbers them
    if (threadIdx.x == 0) {
        mbar_init(bars, 1);
        // Arrivals: the loader's expect_tx; each warp of the warpgroup giving a half back;
        // each thread of the tile's owner.
        const int arrivals[BAR_KINDS] = {1, 1, 4, 4, 128};
        for (int i = 0; i < STAGES; ++i) {
            for (int kind = 0; kind < BAR_KINDS; ++kind) {
                mbar_init(bar_addr(bars, kind, i, STAGES), arrivals[kind]);
            }
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // Warp-uniform to the compiler (a shuffle), or ptxas serialises the products in its branches.
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    if (wg == 2) {  // the loader: one thread issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x != 256) return;
        gdc_wait();
        gdc_launch_dependents();  // after the wait: the merge reads W_UV before its own
        const uint32_t q0 = smem_u32(base), ring = smem_u32(base + L::ring);
        mbar_expect_tx(bars, Q_BYTES);
        for (int c = 0; c < CHUNKS - 1; ++c) {
            tma_load(q0 + c * Q_CHUNK, &qn_map, 64 * c, q_row, bars);
        }
        tma_load(q0 + (CHUNKS - 1) * Q_CHUNK, &qp_map, 0, q_row, bars);
        // Tile j in two groups, as its owner's scores read them (warpgroup j % 2 owns it): the
        // other warpgroup's half of the latent columns, which that one gives back first, then
        // the owner's half and the rope (read by the scores and, once it holds P^T, by the
        // other warpgroup: loaded once both halves are given back). A CPU test steps through
        // these waits, arrivals and copies and the consumers' in every order
        // (tests/kernels/test_mla_decode_value.py: the order of the consumers' calls read from
        // consume, these written in _loader_steps and pinned in PROTOCOL_LINES): change them
        // together.
        const int kv_row = seq * kv_len + first_tile * TILE;
        for (int j = 0; j < n_tiles; ++j) {
            const int slot = j % STAGES, owner = j % 2, row = kv_row + j * TILE;
            const uint32_t dst = ring + slot * L::slot, free_parity = ((j / STAGES) & 1) ^ 1;
            const uint32_t first = bar_addr(bars, LOADED_FIRST, slot, STAGES);
            const uint32_t second = bar_addr(bars, LOADED_SECOND, slot, STAGES);
            mbar_wait(bar_addr(bars, FREE_LEFT + 1 - owner, slot, STAGES), free_parity);
            mbar_expect_tx(first, 4 * L::chunk);
            for (int c = 4 * (1 - owner); c < 4 * (2 - owner); ++c) {
                tma_load(dst + c * L::chunk, &c_map, 64 * c, row, first);
            }
            mbar_wait(bar_addr(bars, FREE_LEFT + owner, slot, STAGES), free_parity);
            mbar_expect_tx(second, 5 * L::chunk);
            for (int c = 4 * owner; c < 4 * (owner + 1); ++c) {
                tma_load(dst + c * L::chunk, &c_map, 64 * c, row, second);
            }
            tma_load(dst + (CHUNKS - 1) * L::chunk, &p_map, 0, row, second);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    gdc_wait();  // part_o may reuse memory the previous call's merge is still reading
    if (wg == 0) {
        consume<L, 0>(smem_u32(base), smem_u32(base + L::ring), bars, (float*)(base + L::stats),
                      n_tiles, scale_log2, part_o, part_lse, q_row, split, n_splits);
    } else {
        consume<L, 1>(smem_u32(base), smem_u32(base + L::ring), bars, (float*)(base + L::stats),
                      n_tiles, scale_log2, part_o, part_lse, q_row, split, n_splits);
    }
}

typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        cudaGetLastError();  // not left for torch's next launch check to blame on another op
        throw std::runtime_error(std::string("cuda MLA split kernel, ") + what + ": " +
                                 cudaGetErrorString(err));
    }
}

// A (rows x cols) bf16 row-major matrix in boxes of box_rows x 64 columns, 128-byte swizzle.
static CUtensorMap tensor_map(long long ptr, long long rows, int cols, int box_rows) {
    static EncodeTiled encode = nullptr;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000,
                                               cudaEnableDefault, &found),
              "cuTensorMapEncodeTiled");
        if (found != cudaDriverEntryPointSuccess || !encode) {
            throw std::runtime_error("cuda MLA split kernel: no cuTensorMapEncodeTiled");
        }
    }
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    const cuuint32_t steps[2] = {1, 1};
    const CUresult res = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)ptr, dims,
                                strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS) {
        throw std::runtime_error("cuda MLA split kernel: cuTensorMapEncodeTiled failed (" +
                                 std::to_string((int)res) + ")");
    }
    return map;
}

template <class L>
static void launch(dim3 grid, cudaStream_t stream, const CUtensorMap* maps, float* part_o,
                   float* part_lse, int heads, int kv_len, int tiles_per_split,
                   float scale_log2) {
    auto kernel = mla_split_kernel<L>;
    static unsigned long long sized = 0;  // devices whose attribute is set, a bit each
    int device;
    check(cudaGetDevice(&device), "cudaGetDevice");
    if (device >= 64 || !(sized >> device & 1)) {  // past 64 devices: set it every launch
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   L::bytes),
              "shared memory");
        if (device < 64) sized |= 1ull << device;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(384, 1, 1);
    config.dynamicSmemBytes = L::bytes;
    config.stream = stream;
    cudaLaunchAttribute attrs[1];
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attrs;
    config.numAttrs = 1;
    check(cudaLaunchKernelEx(&config, kernel, maps[0], maps[1], maps[2], maps[3], part_o,
                             part_lse, heads, kv_len, tiles_per_split, scale_log2),
          "launch");
}

void launch_mla_split(int tile, int stages, bool between, long long q_nope, long long q_pe,
                      long long ckv, long long kpe, long long part_o, long long part_lse,
                      int batch, int heads, int kv_len, int tiles_per_split, int n_splits,
                      double scale_log2, long long stream) {
    const CUtensorMap maps[4] = {
        tensor_map(q_nope, (long long)batch * heads, 512, ROWS),
        tensor_map(q_pe, (long long)batch * heads, 64, ROWS),
        tensor_map(ckv, (long long)batch * kv_len, 512, tile),
        tensor_map(kpe, (long long)batch * kv_len, 64, tile),
    };
    const dim3 grid(batch * heads / ROWS, n_splits, 1);
    const cudaStream_t s = (cudaStream_t)stream;
    auto run = [&](auto build) {
        launch<decltype(build)>(grid, s, maps, (float*)part_o, (float*)part_lse, heads, kv_len,
                                tiles_per_split, (float)scale_log2);
    };
    if (tile == 32 && stages == 4) {
        return between ? run(Layout<32, 4, true>{}) : run(Layout<32, 4, false>{});
    }
    if (tile == 64 && stages == 2) {
        return between ? run(Layout<64, 2, true>{}) : run(Layout<64, 2, false>{});
    }
    throw std::runtime_error("cuda MLA split kernel: no build for tiles of " +
                             std::to_string(tile) + " rows in " + std::to_string(stages) +
                             " stages");
}
"""

CPP_SRC = r"""
void launch_mla_split(int tile, int stages, bool between, long long q_nope, long long q_pe,
                      long long ckv, long long kpe, long long part_o, long long part_lse,
                      int batch, int heads, int kv_len, int tiles_per_split, int n_splits,
                      double scale_log2, long long stream);
"""


# The kernel's wgmma forms: (name, N, A from registers, imm-trans-a, imm-trans-b). wgmma_ss
# m64n32k16 and m64n64k16 (A and B K-major from shared memory: the scores of 32- and 64-row
# tiles), wgmma_ss_tt m64n256k16 (A and B MN-major: P from shared memory, V) and wgmma_rs_t
# m64n256k16 (A from registers, B MN-major).
WGMMA_FORMS = (
    ("wgmma_ss", 32, False, 0, 0),
    ("wgmma_ss", 64, False, 0, 0),
    ("wgmma_ss_tt", 256, False, 1, 1),
    ("wgmma_rs_t", 256, True, 0, 1),
)


def wgmma_wrappers(forms=WGMMA_FORMS) -> str:
    """The inline-PTX wgmma.mma_async m64nNk16 calls of `forms`, bf16 in and fp32 accumulated, one
    accumulator operand per register (hence generated), as overloads on the accumulator array's
    size N/2. D = A B + D, or A B where scale_d is 0. scripts/probe_wgmma_gpu.py builds its own
    forms with this too."""
    out = []
    for name, n, a_regs, trans_a, trans_b in forms:
        nd = n // 2
        if a_regs:  # d, a, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b
            a_op = "{" + ", ".join(f"%{nd + i}" for i in range(4)) + "}"
            b_op, sc, imm = nd + 4, nd + 5, f"1, 1, {trans_b}"
            params = "const uint32_t* a, uint64_t db"
            ins = ", ".join([f'"r"(a[{i}])' for i in range(4)] + ['"l"(db)', '"r"(scale_d)'])
        else:  # d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b
            a_op, b_op, sc, imm = f"%{nd}", nd + 1, nd + 2, f"1, 1, {trans_a}, {trans_b}"
            params, ins = "uint64_t da, uint64_t db", '"l"(da), "l"(db), "r"(scale_d)'
        acc = ", ".join(f"%{i}" for i in range(nd))
        outs = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
        out.append(
            f"__device__ __forceinline__ void {name}(float (&d)[{nd}], {params}, "
            "int scale_d = 1) {\n"
            f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"\n'
            f'                 "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "\n'
            f'                 "{{{acc}}}, {a_op}, %{b_op}, p, {imm};\\n}}\\n"\n'
            f"                 : {outs}\n"
            f"                 : {ins});\n"
            "}"
        )
    return "\n".join(out)


def cuda_source() -> str:
    """CUDA_SRC with the generated wgmma wrappers in place."""
    return CUDA_SRC.replace("@WGMMA@", wgmma_wrappers())


def sm90a_extension(name: str, cpp_source: str, cuda_source: str, functions: list[str]):
    """torch's load_inline build of `cuda_source` for the sm_90a target, which wgmma and
    setmaxnreg need: an explicit -gencode keeps torch from adding its own sm_90 target
    (cpp_extension adds no arch flags once one is given). scripts/probe_wgmma_gpu.py builds its
    probe with this too."""
    return torch.utils.cpp_extension.load_inline(
        name=name,
        cpp_sources=cpp_source,
        cuda_sources=cuda_source,
        functions=functions,
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
        verbose=False,
    )


@functools.cache
def _ext():
    return sm90a_extension(
        "cuda_mla_decode_value_ext", CPP_SRC, cuda_source(), ["launch_mla_split"]
    )


@triton.jit
def _project(acc, parts, ok, weights, w, USE_DOT: tl.constexpr):
    """acc plus one step of columns: the splits' partials at `parts` merged by `weights`,
    rounded to w's dtype, times the weight tile w (DV x BLOCK_K)."""
    p = tl.load(parts, mask=ok[:, :, None], other=0.0)
    o = tl.sum(weights[:, :, None] * p, axis=1).to(w.dtype)  # the merged latent columns
    if USE_DOT:
        return tl.dot(o, tl.trans(w), acc)
    return acc + tl.sum(o.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _merge_value_kernel(po_ptr, plse_ptr, w_ptr, y_ptr, sum_ptr, count_ptr, B, H, n_splits,
                        R: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
                        COLUMN_SLICES: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """BLOCK_M sequences of one head: their splits' partial outputs (rows (sequence, head,
    split) of R fp32) weighted by the splits' log2-sum-exp, BLOCK_K columns a step, rounded to
    y's dtype, times the head's W_UV (DV x R); y is (sequence, head, DV). With COLUMN_SLICES
    above 1, a program takes one slice of the R columns and stores its product in sum_ptr; the
    last of a tile's slices to count itself in count_ptr adds them up and stores y. Its first
    weight tile is loaded before its griddepcontrol.wait: the split kernel lets it launch only
    after its own wait, so whatever wrote W_UV before the split kernel is done."""
    head = tl.program_id(1)
    slice_cols: tl.constexpr = R // COLUMN_SLICES
    col0 = tl.program_id(2) * slice_cols
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < B
    rows = rm.to(tl.int64) * H + head  # (sequence, head) rows of y and of the partials
    dv = tl.arange(0, DV)
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + head.to(tl.int64) * DV * R + dv[:, None] * R + col0
    w = tl.load(w_rows + kk[None, :], eviction_policy="evict_first")
    tl.extra.cuda.gdc_wait()
    s = tl.arange(0, BLOCK_S)
    ok = m_ok[:, None] & (s[None, :] < n_splits)
    part = rows[:, None] * n_splits + s[None, :]  # (BLOCK_M, BLOCK_S) partial rows
    lse = tl.load(plse_ptr + part, mask=ok, other=float("-inf"))
    top = tl.max(lse, axis=1)
    top = tl.where(m_ok, top, 0.0)
    weights = tl.exp2(lse - top[:, None])
    weights = tl.where(m_ok[:, None], weights / tl.sum(weights, axis=1)[:, None], 0.0)
    parts = po_ptr + part[:, :, None] * R + col0 + kk[None, None, :]
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
    acc = _project(acc, parts, ok, weights, w, USE_DOT)
    for k0 in tl.range(BLOCK_K, slice_cols, BLOCK_K, num_stages=STAGES):
        w = tl.load(w_rows + k0 + kk[None, :], eviction_policy="evict_first")
        acc = _project(acc, parts + k0, ok, weights, w, USE_DOT)
    done = COLUMN_SLICES == 1
    if COLUMN_SLICES > 1:
        tile = tl.program_id(0) * H + head
        cell = tl.arange(0, BLOCK_M)[:, None] * DV + dv[None, :]
        tile_sums = sum_ptr + tile.to(tl.int64) * (COLUMN_SLICES * BLOCK_M * DV) + cell
        tl.store(tile_sums + tl.program_id(2) * (BLOCK_M * DV), acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        done = arrived == COLUMN_SLICES - 1
        if done:
            tl.store(count_ptr + tile, 0)  # every slice has counted: ready for the next call
            acc = tl.load(tile_sums)
            for c in tl.static_range(1, COLUMN_SLICES):
                acc += tl.load(tile_sums + c * (BLOCK_M * DV))
    if done:
        out = y_ptr + rows[:, None] * DV + dv[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])


def split_tiles(programs: int, tiles: int, sms: int) -> int:
    """Tiles per split so that the programs run in one wave of one per SM, in at most
    MAX_SPLITS splits (at 132 SMs, one sequence of 2 head blocks over 1024 tiles: 16 tiles a
    split, 128 programs)."""
    return triton.cdiv(tiles, max(1, min(tiles, sms // programs, MAX_SPLITS)))


# The arrival counts of column slices, per device: zero between calls (the last slice of a
# tile resets its count). Every buffer is kept, as a CUDA graph may hold any of them.
_COUNTS: dict[torch.device, list[torch.Tensor]] = {}


def _arrival_counts(n: int, device: torch.device) -> torch.Tensor:
    held = _COUNTS.setdefault(device, [])
    if held and held[-1].numel() >= n:
        return held[-1]
    if torch.cuda.is_current_stream_capturing():
        # A buffer made while a graph is captured is zeroed only when the graph replays: this
        # call's graph zeroes its own counts, and no other call shares them.
        return torch.zeros(n, dtype=torch.int32, device=device)
    size = max(n, 2 * held[-1].numel() if held else 0)
    held.append(torch.zeros(size, dtype=torch.int32, device=device))
    return held[-1]


def _refusal(q_nope, q_pe, ckv, kpe, w_uv, block_n: int, num_stages: int, block_m: int,
             block_k: int, column_slices: int):  # fmt: skip
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    tensors = (q_nope, q_pe, ckv, kpe, w_uv)
    if not all(t.dim() == 3 for t in tensors):
        return "needs 3-D q_nope, q_pe, ckv, kpe and w_uv"
    if any(t.dtype != torch.bfloat16 for t in tensors):
        return f"needs bf16 inputs; got {[t.dtype for t in tensors]}"
    if not all(t.is_contiguous() for t in tensors):
        return "needs contiguous inputs"
    b, h, r = q_nope.shape
    kv_len = ckv.shape[1]
    if r != RANK or q_pe.shape != (b, h, ROPE) or ckv.shape != (b, kv_len, RANK):
        return f"rank {RANK} and rope {ROPE} only; got q_nope {tuple(q_nope.shape)}, q_pe " + (
            f"{tuple(q_pe.shape)}, ckv {tuple(ckv.shape)}"
        )
    if kpe.shape != (b, kv_len, ROPE):
        return f"kpe {tuple(kpe.shape)} does not match ckv {tuple(ckv.shape)}"
    if w_uv.shape != (h, V_DIM, RANK):
        return f"w_uv {tuple(w_uv.shape)}: ({h}, {V_DIM}, {RANK}) only"
    if h % HEADS:
        return f"heads {h}: a multiple of {HEADS} only"
    if (block_n, num_stages) not in BUILDS:
        return (
            f"block_n {block_n} with num_stages {num_stages}: (block_n, num_stages) one of "
            f"{list(BUILDS)} (the builds of the split kernel)"
        )
    if kv_len == 0 or kv_len % block_n:
        return f"kv_len {kv_len}: a positive multiple of block_n {block_n} only"
    if b * max(h, kv_len) >= 2**31:
        return f"batch {b} x {max(h, kv_len)} rows above TMA's 32-bit coordinates"
    if block_m not in (1, 16):
        return f"block_m {block_m}: 1 (CUDA cores) or 16 (tensor cores)"
    if block_k < (16 if block_m == 16 else 1) or block_k & (block_k - 1) or RANK % block_k:
        return f"block_k {block_k}: a power of two dividing {RANK}, 16 at least with block_m 16"
    if column_slices < 1 or RANK % (column_slices * block_k):
        return f"column_slices {column_slices}: {RANK} columns in slices of whole block_k steps"
    if any(t.data_ptr() % 16 for t in tensors):
        return "needs 16-byte aligned inputs (TMA)"
    if not q_nope.is_cuda or torch.cuda.get_device_capability(q_nope.device) != (9, 0):
        return f"needs an sm_90 GPU (H100/H200: wgmma, setmaxnreg); got {q_nope.device}"
    if any(t.device != q_nope.device for t in tensors):
        return f"inputs on {[str(t.device) for t in tensors]}"
    return None


def kernel(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    w_uv: torch.Tensor,
    block_n: int = 32,
    num_stages: int = 4,
    values_between: bool = False,
    block_m: int = 1,
    block_k: int = 64,
    merge_warps: int = 4,
    merge_stages: int = 3,
    column_slices: int = 1,
) -> torch.Tensor:
    why = _refusal(
        q_nope, q_pe, ckv, kpe, w_uv, block_n, num_stages, block_m, block_k, column_slices
    )
    if why is not None:
        raise ValueError(f"cuda MLA decode with W_UV {why}")
    b, h, r = q_nope.shape
    kv_len = ckv.shape[1]
    device = q_nope.device
    out = torch.empty((b, h, V_DIM), device=device, dtype=q_nope.dtype)
    if b * h == 0:
        return out
    programs = b * h // HEADS
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = split_tiles(programs, kv_len // block_n, sms)
    n_splits = triton.cdiv(kv_len // block_n, tiles)
    block_s = max(2, triton.next_power_of_2(n_splits))
    part_o = torch.empty((b * h * n_splits, r), device=device, dtype=torch.float32)
    part_lse = torch.empty((b * h * n_splits,), device=device, dtype=torch.float32)
    tiles_m = triton.cdiv(b, block_m)
    sums = counts = None
    if column_slices > 1:
        sums = torch.empty(
            tiles_m * h * column_slices * block_m * V_DIM, device=device, dtype=torch.float32
        )
        counts = _arrival_counts(tiles_m * h, device)
    with torch.cuda.device(device):
        _ext().launch_mla_split(
            block_n, num_stages, values_between, q_nope.data_ptr(), q_pe.data_ptr(), ckv.data_ptr(),
            kpe.data_ptr(), part_o.data_ptr(), part_lse.data_ptr(), b, h, kv_len, tiles, n_splits,
            LOG2E / math.sqrt(SCALE_DIM), torch.cuda.current_stream(device).cuda_stream,
        )  # fmt: skip
        try:
            _merge_value_kernel[(tiles_m, h, column_slices)](
                part_o, part_lse, w_uv, out, sums, counts, b, h, n_splits, R=r, DV=V_DIM,
                BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_K=block_k, USE_DOT=block_m >= 16,
                COLUMN_SLICES=column_slices, STAGES=merge_stages, num_warps=merge_warps,
                launch_pdl=True,
            )  # fmt: skip
        except OutOfResources as exc:  # e.g. the pipelined tiles of partials outgrow an SM
            smaller = ["a smaller block_k", "fewer merge_stages"]
            if block_m > 1:
                smaller.insert(0, "block_m 1")
            raise ValueError(
                f"cuda MLA decode with W_UV: the merge at block_m {block_m} over {n_splits} "
                f"splits in {block_k}-column steps, {merge_stages} stages deep, "
                f"{merge_warps} warps, does not fit ({exc}); try {' or '.join(smaller)}"
            ) from exc
    return out

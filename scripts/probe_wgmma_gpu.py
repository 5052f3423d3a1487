"""Probe the shared-memory matrix descriptors of Hopper's `wgmma.mma_async` (sm_90a) with the
128-byte swizzle on the real GPU, before MLA's decode split kernel is built on them.

One CTA of 128 threads (one warpgroup) per test; CUDA C++ with inline PTX, built at run time with
torch's load_inline for `sm_90a` (wgmma needs the `a` target). Every operand is a bf16 matrix of
64 rows (32 for the split kernel's cache tiles) that the threads copy from global to shared memory
themselves in the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and a 64-element box width
("chunked SW128", see CUDA_SRC). The
tests, each against a float64 reference of the same bf16 inputs on the CPU:

  qk_kmajor_n64    S = Q K^T (64 x 576 by 64 x 576), both operands K-major from shared memory,
                   m64n64k16 over 36 K steps: 32 bytes a step within a chunk, the next chunk
                   every 4 steps.
  pv_ss_n64        O = P V[:, :512] (P 64 x 64, V the same 64 x 576 cache tile), A = P K-major
                   from shared memory, B = V MN-major (imm-trans-b = 1), eight m64n64k16 pieces.
  pv_ss_n256       the same with two m64n256k16 halves (B spans 4 swizzle atoms along N: LBO).
  pv_rs_n256       the same with A = P from registers (the `{a regs}` form).
  qk_pv_chain_rs   S = Q K^T as in the first, then O = bf16(S) V[:, :512] with A taken straight
                   from S's accumulators (column groups 2s, 2s + 1 are K step s's fragment), as
                   a flash-attention kernel hands its probabilities on; O against bf16(S as the
                   GPU computed it) V, S against Q K^T.
  tile32_chain_ss_tt   the split kernel's 32-row tiles: S = Q K^T with a 32-row tile
                   (m64n32k16), P = bf16(S) stored from the accumulators, transposed, into the
                   tile's rope chunk, then O = P V with P an MN-major A operand (trans-a) and V
                   MN-major with the 4 KiB chunks' LBO (4096); checked as the chained test.
  handoff_two_warpgroups   the same tile with the split kernel's two warpgroups: the first
                   computes S and stores P, fence.proxy.async, a named barrier; then it multiplies
                   O[:, :256] with P from registers and, that product in flight, issues S again
                   over the latent 512 columns (wait_group 1, then 0), while the second
                   multiplies O[:, 256:] with P from shared memory.
  diag_pv_ss_n256_swapped   pv_ss_n256 with B's LBO and SBO swapped: must FAIL (a numerical
                   miss, not a launch error): it shows that the tests can tell the two apart.

Inputs are random normal bf16 (seed 0, no zeros). The products of bf16 values are exact in
float32, so the only error left is float32 accumulation (order unspecified, 9.7.15.5.2): a test
passes when max |out - ref| <= 1e-3 sqrt(K) (0.024 for K = 576, 0.008 for K = 64), where a
misplaced operand element moves an output by O(1); on an H100 (session 52) the errors were
6.4e-05 at K = 576, 4.2e-06 at K = 64, 1.2e-04 and 5.8e-05 in the chained tests. torch's own
float32 matmul error on the same GPU (TF32 off; for the chained tests, of S) is printed beside it
for scale.

Scope: one CTA, one warpgroup (two in the hand-off test), scale-d 1 only; the operands are written
by the threads' own stores in the layout TMA's 128-byte swizzle produces (TMA itself is not run,
nor mbarriers: the hand-off uses a named barrier).

Descriptors (PTX ISA, "Matrix Descriptor Format"): start address, LBO and SBO each
(x & 0x3FFFF) >> 4 in bits 0-13, 16-29 and 32-45, base offset 0 (every swizzle pattern starts on
a 1024-byte boundary), swizzle mode 1 (128B) in bits 62-63. K-major operands: LBO 16 ("not used,
assumed to be 1"), SBO 1024 (8 rows of 128 bytes). MN-major operands (V; P in the 32-row test):
LBO the chunk's size, 8192 at 64 rows and 4096 at 32 (from one 64-element swizzle atom along MN
to the next, i.e. the next chunk), SBO 1024 (from 8 K rows to the next 8).

    python3 scripts/probe_wgmma_gpu.py [--json OUT.json]   # on an H100/H200: exit 0 = all pass
    python3 scripts/probe_wgmma_gpu.py --selfcheck         # CPU only: emulate layouts/addresses
    python3 scripts/probe_wgmma_gpu.py --emit-cuda F.cu    # write CUDA_SRC (nvcc -c compiles it)

Exit codes: 0 all tests pass, 1 a test (or the build) fails, 2 no CUDA device / not sm_90.
"""

import argparse
import functools
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROWS = 64  # heads (Q, P) or cache positions (K, V)
DIM = 576  # MLA's latent 512 + rope 64
DV = 512  # O's columns: V is the cache tile's first 512 columns
CHUNK_BYTES = ROWS * 128  # one chunk: 64 rows x 64 bf16 columns (128 bytes)
SW128 = 1  # descriptor swizzle mode 1 = 128-byte swizzle
# Descriptor strides in bytes (module docstring): K-major (A, and B of Q K^T), MN-major (B = V).
KMAJOR_LBO, KMAJOR_SBO = 16, 1024
MNMAJOR_LBO, MNMAJOR_SBO = CHUNK_BYTES, 1024
TILE = 32  # the 32-row cache tiles of tile32_kernel: chunks of 4 KiB, so V's and P's LBO is 4096
TILE_LBO = TILE * 128
# Shared-memory regions of the kernels, offsets from a 1024-byte-aligned base (as in CUDA_SRC).
QK_REGIONS = {"q": 0, "k": (DIM // 64) * CHUNK_BYTES}
PV_REGIONS = {"p": 0, "v": CHUNK_BYTES}

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdexcept>
#include <string>

// PTX ISA sections followed (9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions"): 9.7.15.5.1.2 "Shared Memory Matrix Layout" (swizzle atoms, "Leading Dimension
// Byte Offset", "Stride Dimension Byte Offset", "Canonical Layouts"), 9.7.15.5.1.2.2 "Matrix
// Descriptor Format", 9.7.15.5.1.1.1 "Matrix Fragments for wgmma.mma_async.m64nNk16" (A in
// registers, accumulator D), 9.7.15.5.2 "wgmma.mma_async", 9.7.15.4 "Async Proxy",
// 9.7.15.7.1-3 "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group".
//
// Chunked SW128: a 64-row x C-column bf16 matrix (C a multiple of 64) is C/64 chunks of 64
// columns, 8 KiB each; chunk c holds columns 64c..64c+63, row r at byte 128 r of the chunk,
// and in each 8-row x 128-byte atom the 16-byte unit u of row r is stored at unit u ^ (r % 8).
// Chunks start on 1024-byte boundaries, so this equals the hardware's 128B swizzle of the
// shared address (bits [4,7) ^= bits [7,10), Swizzle<3,4,3> on bytes).

constexpr int ROWS = 64;
constexpr int DIM = 576;
constexpr int DV = 512;
constexpr int CHUNK_BYTES = ROWS * 128;
constexpr int DIM_CHUNKS = DIM / 64;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// The dynamic shared memory rounded up to 1024 bytes (the launch asks for 1024 more).
__device__ __forceinline__ unsigned char* align1024(unsigned char* p) {
    return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}

// Row-major global [rows][cols] bf16 -> chunked SW128 at dst (chunks of rows x 128 bytes), with
// plain 16-byte stores.
__device__ __forceinline__ void fill_sw128(unsigned char* dst, const uint4* src, int rows,
                                           int cols) {
    const int units_per_row = cols / 8;
    for (int u = threadIdx.x; u < rows * units_per_row; u += blockDim.x) {
        const int row = u / units_per_row, c16 = u % units_per_row;
        const int chunk = c16 / 8, unit = c16 % 8;
        *(uint4*)(dst + chunk * rows * 128 + row * 128 + ((unit ^ (row & 7)) << 4)) = src[u];
    }
}

// Generic-proxy stores -> visible to wgmma (async proxy), then the CTA barrier (9.7.15.4).
__device__ __forceinline__ void smem_to_async_proxy() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}

// Q (64 x 576) at the 1024-aligned base and a cache tile (rows x 576) right after it, both
// chunked SW128, made visible to wgmma; returns Q's address (the tile's is DIM_CHUNKS chunks on).
__device__ __forceinline__ unsigned char* load_q_and_tile(unsigned char* smem_raw, const uint4* q,
                                                          const uint4* kv, int rows) {
    unsigned char* sq = align1024(smem_raw);
    fill_sw128(sq, q, ROWS, DIM);
    fill_sw128(sq + DIM_CHUNKS * CHUNK_BYTES, kv, rows, DIM);
    smem_to_async_proxy();
    return sq;
}

// Matrix Descriptor Format: encode(x) = (x & 0x3FFFF) >> 4; start 0-13, LBO 16-29, SBO 32-45,
// base offset 49-51 (0: patterns start on 1024-byte boundaries), swizzle 62-63 (1 = 128B).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait1() {
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from touching the accumulators across the wait.
template <int NREG>
__device__ __forceinline__ void acc_fence(float* d) {
#pragma unroll
    for (int i = 0; i < NREG; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

@WGMMA@

// Accumulator D of m64nNk16: warp w owns rows 16w..16w+15; lane l holds for each 8-column
// group j: d[4j], d[4j+1] at row 16w + l/4, columns 8j + 2(l%4), +1; d[4j+2], d[4j+3] at row +8.
template <int N>
__device__ __forceinline__ void store_acc(const float* d, float* out, int ld, int col0) {
    const int lane = threadIdx.x % 32;
    const int row = 16 * (threadIdx.x % 128 / 32) + lane / 4, col = col0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        out[row * ld + col + 8 * j] = d[4 * j];
        out[row * ld + col + 8 * j + 1] = d[4 * j + 1];
        out[(row + 8) * ld + col + 8 * j] = d[4 * j + 2];
        out[(row + 8) * ld + col + 8 * j + 1] = d[4 * j + 3];
    }
}

// S[64][N] = Q K^T for a K tile of N rows: A = Q (chunks of 64 rows), B = K (chunks of N rows),
// both K-major chunked SW128. K step ks (16 columns, 32 bytes) starts at chunk ks/4, byte 32 (ks%4)
// of the chunk's first row. Waits for the products.
// (STEPS K steps of 16 from column 0: all 36 of 576, or the 32 of the latent 512 alone.)
template <int N, int STEPS = DIM / 16>
__device__ __forceinline__ void issue_scores(float (&d)[N / 2], uint32_t q0, uint32_t k0, int lbo,
                                             int sbo) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < STEPS; ++ks) {
        const uint32_t qoff = (ks / 4) * CHUNK_BYTES + (ks % 4) * 32;
        const uint32_t koff = (ks / 4) * N * 128 + (ks % 4) * 32;
        wgmma_ss(d, make_desc(q0 + qoff, lbo, sbo), make_desc(k0 + koff, lbo, sbo), 1);
    }
    wg_commit();
}

template <int N>
__device__ __forceinline__ void scores(float (&d)[N / 2], uint32_t q0, uint32_t k0, int lbo,
                                       int sbo) {
    issue_scores<N>(d, q0, k0, lbo, sbo);
    wg_wait0();
    acc_fence<N / 2>(d);
}

__global__ void __launch_bounds__(128) qk_kernel(const uint4* q, const uint4* k, float* s,
                                                  int lbo, int sbo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* sq = load_q_and_tile(smem_raw, q, k, ROWS);
    unsigned char* sk = sq + DIM_CHUNKS * CHUNK_BYTES;
    float d[32];
    scores<64>(d, smem_u32(sq), smem_u32(sk), lbo, sbo);
    store_acc<64>(d, s, 64, 0);
}

// A = P (64 x 64, K-major, one chunk) for K step ks: from shared memory, start + 32 ks; or
// from registers (fragment of m64nNk16: a0,a1 row g, cols 2t,2t+1; a2,a3 row g+8; a4..a7 the
// same at cols +8; g = l/4, t = l%4, rows of warp w offset by 16w), loaded straight from global.
__device__ __forceinline__ void load_a_frag(const uint32_t* p32, int ks, uint32_t* a) {
    const int lane = threadIdx.x % 32;
    const int row = 16 * (threadIdx.x % 128 / 32) + lane / 4, col = 16 * ks + 2 * (lane % 4);
    a[0] = p32[(row * 64 + col) / 2];
    a[1] = p32[((row + 8) * 64 + col) / 2];
    a[2] = p32[(row * 64 + col + 8) / 2];
    a[3] = p32[((row + 8) * 64 + col + 8) / 2];
}

// O[64][512] = P V[:, :512]: B = V MN-major (imm-trans-b = 1) chunked SW128. K step ks = cache
// rows 16ks..16ks+15 starts 16 rows (2048 bytes) further; N piece n0 (a multiple of 64) starts at
// chunk n0/64; along N the next 64 columns are LBO away, along K the next 8 rows SBO away.
template <int N, bool A_REGS>
__global__ void __launch_bounds__(128) pv_kernel(const uint4* p, const uint4* v, float* o,
                                                  int a_lbo, int a_sbo, int b_lbo, int b_sbo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* sp = align1024(smem_raw);
    unsigned char* sv = sp + CHUNK_BYTES;
    fill_sw128(sp, p, ROWS, 64);
    fill_sw128(sv, v, ROWS, DIM);
    smem_to_async_proxy();
    const uint32_t p0 = smem_u32(sp), v0 = smem_u32(sv);
    uint32_t a[4][4];
    if constexpr (A_REGS) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) load_a_frag((const uint32_t*)p, ks, a[ks]);
    }
#pragma unroll 1
    for (int n0 = 0; n0 < DV; n0 += N) {
        float d[N / 2];
#pragma unroll
        for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            const uint64_t db =
                make_desc(v0 + (n0 / 64) * CHUNK_BYTES + ks * 16 * 128, b_lbo, b_sbo);
            if constexpr (A_REGS) {
                wgmma_rs_t(d, a[ks], db);
            } else {
                wgmma_ss_t(d, make_desc(p0 + ks * 32, a_lbo, a_sbo), db);
            }
        }
        wg_commit();
        wg_wait0();
        acc_fence<N / 2>(d);
        store_acc<N>(d, o, DV, n0);
    }
}

// S = Q K^T as in qk_kernel, then O = bf16(S) V[:, :512] with A taken straight from S's
// accumulators, as a flash-attention kernel hands its probabilities on: for K step s (columns
// 16s..16s+15 of S) a thread's A fragment is its accumulator column groups 2s and 2s + 1 (same
// rows, same columns within the group). Writes O to columns 0..511 of out (64 x 576) and S (fp32,
// for the reference) to columns 512..575.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// A fragments of K steps 0..STEPS-1 straight from an m64nNk16 accumulator (N = 16 STEPS): step s
// is the accumulator's column groups 2s and 2s + 1 (same rows, same columns within the group).
template <int STEPS>
__device__ __forceinline__ void pack_a(const float* d, uint32_t (&a)[STEPS][4]) {
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[s][r] = pack_bf16(d[8 * s + 2 * r], d[8 * s + 2 * r + 1]);
    }
}

__global__ void __launch_bounds__(128) qk_pv_kernel(const uint4* q, const uint4* kv, float* out,
                                                     int a_lbo, int a_sbo, int b_lbo, int b_sbo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* sq = load_q_and_tile(smem_raw, q, kv, ROWS);
    unsigned char* sk = sq + DIM_CHUNKS * CHUNK_BYTES;
    float d[32];
    const uint32_t k0 = smem_u32(sk);
    scores<64>(d, smem_u32(sq), k0, a_lbo, a_sbo);
    store_acc<64>(d, out, DIM, DV);
    uint32_t a[4][4];
    pack_a<4>(d, a);
#pragma unroll 1
    for (int n0 = 0; n0 < DV; n0 += 256) {
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            const uint32_t vb = k0 + (n0 / 64) * CHUNK_BYTES + ks * 16 * 128;
            wgmma_rs_t(o, a[ks], make_desc(vb, b_lbo, b_sbo));
        }
        wg_commit();
        wg_wait0();
        acc_fence<128>(o);
        store_acc<256>(o, out, DIM, n0);
    }
}

// The split kernel's 32-row tiles (the Gluon kernel's block_n 32): S = Q K^T with K a 32-row tile
// (m64n32k16 x 36; the tile's chunks are 32 rows x 128 bytes, 4 KiB), then P = bf16(S) stored
// from the accumulators, transposed (positions x heads, heads contiguous), into the tile's rope
// chunk (chunk 8, which only the scores read), then O = P V[:, :512] with A = P an MN-major
// operand from that chunk (imm-trans-a = 1) and B = V MN-major (LBO 4096: the next 64 columns
// are the next 4 KiB chunk). a_lbo/a_sbo: the K-major strides of S; b_lbo/b_sbo: the MN-major
// strides of P and V. Writes O to columns 0..511 of out (64 x 544) and S to 512..543.
constexpr int TILE = 32;

// P = bf16(S) of a 64 x TILE accumulator, transposed into the tile's rope chunk: P^T[k][m]
// (k = position, m = head) at byte 128 k + 16 ((m / 8) ^ (k % 8)) + 2 (m % 8).
__device__ __forceinline__ void store_p_transposed(const float (&d)[TILE / 2], unsigned char* sp) {
    const int lane = threadIdx.x % 32;
    const int m0 = 16 * (threadIdx.x % 128 / 32) + lane / 4, kc = 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < TILE / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int m = m0 + (e >= 2 ? 8 : 0), k = 8 * j + kc + (e & 1);
            *(__nv_bfloat16*)(sp + k * 128 + (((m / 8) ^ (k % 8)) << 4) + (m % 8) * 2) =
                __float2bfloat16_rn(d[4 * j + e]);
        }
    }
}

__global__ void __launch_bounds__(128) tile32_kernel(const uint4* q, const uint4* kv, float* out,
                                                      int a_lbo, int a_sbo, int b_lbo, int b_sbo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* sq = load_q_and_tile(smem_raw, q, kv, TILE);
    unsigned char* sk = sq + DIM_CHUNKS * CHUNK_BYTES;
    float d[16];
    const uint32_t k0 = smem_u32(sk);
    scores<TILE>(d, smem_u32(sq), k0, a_lbo, a_sbo);
    store_acc<32>(d, out, DV + TILE, DV);
    unsigned char* sp = sk + (DIM_CHUNKS - 1) * TILE * 128;
    store_p_transposed(d, sp);
    smem_to_async_proxy();
    const uint32_t p0 = smem_u32(sp);
#pragma unroll 1
    for (int n0 = 0; n0 < DV; n0 += 256) {
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < TILE / 16; ++ks) {
            wgmma_ss_tt(o, make_desc(p0 + ks * 16 * 128, b_lbo, b_sbo),
                        make_desc(k0 + (n0 / 64) * TILE * 128 + ks * 16 * 128, b_lbo, b_sbo));
        }
        wg_commit();
        wg_wait0();
        acc_fence<128>(o);
        store_acc<256>(o, out, DV + TILE, n0);
    }
}

// The split kernel's hand-off between its two warpgroups, on a 32-row tile: warpgroup 0 computes
// S = Q K^T, stores P = bf16(S) transposed into the rope chunk, makes it visible to the async
// proxy and meets warpgroup 1 at a named barrier. Then warpgroup 0 multiplies O[:, :256] =
// P V[:, :256] with P from its registers and, with that product in flight, issues the scores
// again over the latent 512 columns (S2; the rope chunk now holds P) and waits with wait_group 1
// (the value product done, S2 perhaps not) before storing O, then waits for S2; warpgroup 1
// multiplies O[:, 256:] with P from shared memory. Writes O to columns 0..511 of out (64 x 576),
// S2 to 512..543 and S to 544..575.
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__global__ void __launch_bounds__(256) handoff_kernel(const uint4* q, const uint4* kv, float* out,
                                                       int a_lbo, int a_sbo, int b_lbo, int b_sbo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* sq = load_q_and_tile(smem_raw, q, kv, TILE);
    unsigned char* sk = sq + DIM_CHUNKS * CHUNK_BYTES;
    unsigned char* sp = sk + (DIM_CHUNKS - 1) * TILE * 128;
    const uint32_t q0 = smem_u32(sq), k0 = smem_u32(sk), p0 = smem_u32(sp);
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    if (threadIdx.x < 128) {
        float d[16], d2[16];
        scores<TILE>(d, q0, k0, a_lbo, a_sbo);
        store_acc<32>(d, out, DIM, DV + TILE);
        store_p_transposed(d, sp);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_barrier(1, 256);
        uint32_t a[2][4];
        pack_a<2>(d, a);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < TILE / 16; ++ks) {
            wgmma_rs_t(o, a[ks], make_desc(k0 + ks * 16 * 128, b_lbo, b_sbo));
        }
        wg_commit();
        issue_scores<TILE, DV / 16>(d2, q0, k0, a_lbo, a_sbo);  // the rope chunk now holds P
        wg_wait1();
        acc_fence<128>(o);
        store_acc<256>(o, out, DIM, 0);
        wg_wait0();
        acc_fence<16>(d2);
        store_acc<32>(d2, out, DIM, DV);
    } else {
        named_barrier(1, 256);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < TILE / 16; ++ks) {
            wgmma_ss_tt(o, make_desc(p0 + ks * 16 * 128, b_lbo, b_sbo),
                        make_desc(k0 + 4 * TILE * 128 + ks * 16 * 128, b_lbo, b_sbo));
        }
        wg_commit();
        wg_wait0();
        acc_fence<128>(o);
        store_acc<256>(o, out, DIM, 256);
    }
}

static void check(cudaError_t err) {
    if (err != cudaSuccess) {
        cudaGetLastError();  // not left for torch's next launch check to blame on another op
        throw std::runtime_error(std::string("probe_wgmma: ") + cudaGetErrorString(err));
    }
}

template <int N, bool A_REGS>
static void launch_pv(cudaStream_t s, const void* p, const void* v, float* o, int a_lbo,
                      int a_sbo, int b_lbo, int b_sbo) {
    const int smem = (1 + DIM_CHUNKS) * CHUNK_BYTES + 1024;
    check(cudaFuncSetAttribute(pv_kernel<N, A_REGS>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    pv_kernel<N, A_REGS><<<1, 128, smem, s>>>((const uint4*)p, (const uint4*)v, o, a_lbo,
                                               a_sbo, b_lbo, b_sbo);
}

// test 0: qk_kernel (a = Q, b = K, a_lbo/a_sbo for both); 1: pv_kernel n64, A from shared
// memory; 2: n256, A from shared memory; 3: n256, A from registers (a = P, b = the cache tile);
// 4: qk_pv_kernel (a = Q, b = the cache tile; a_lbo/a_sbo K-major, b_lbo/b_sbo V's); 5:
// tile32_kernel (a = Q, b = a 32-row cache tile; the same strides, b's also P's); 6:
// handoff_kernel (as 5, two warpgroups).
void launch_probe(int test, long long a, long long b, long long out, int a_lbo, int a_sbo,
                  int b_lbo, int b_sbo, long long stream) {
    const cudaStream_t s = (cudaStream_t)stream;
    const void* pa = (const void*)a;
    const void* pb = (const void*)b;
    float* po = (float*)out;
    if (test == 0) {
        const int smem = 2 * DIM_CHUNKS * CHUNK_BYTES + 1024;
        check(cudaFuncSetAttribute(qk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        qk_kernel<<<1, 128, smem, s>>>((const uint4*)pa, (const uint4*)pb, po, a_lbo, a_sbo);
    } else if (test == 1) {
        launch_pv<64, false>(s, pa, pb, po, a_lbo, a_sbo, b_lbo, b_sbo);
    } else if (test == 2) {
        launch_pv<256, false>(s, pa, pb, po, a_lbo, a_sbo, b_lbo, b_sbo);
    } else if (test == 3) {
        launch_pv<256, true>(s, pa, pb, po, a_lbo, a_sbo, b_lbo, b_sbo);
    } else if (test == 4) {
        const int smem = 2 * DIM_CHUNKS * CHUNK_BYTES + 1024;
        check(cudaFuncSetAttribute(qk_pv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem));
        qk_pv_kernel<<<1, 128, smem, s>>>((const uint4*)pa, (const uint4*)pb, po, a_lbo, a_sbo,
                                          b_lbo, b_sbo);
    } else if (test == 5) {
        const int smem = DIM_CHUNKS * (CHUNK_BYTES + TILE * 128) + 1024;
        check(cudaFuncSetAttribute(tile32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem));
        tile32_kernel<<<1, 128, smem, s>>>((const uint4*)pa, (const uint4*)pb, po, a_lbo, a_sbo,
                                           b_lbo, b_sbo);
    } else if (test == 6) {
        const int smem = DIM_CHUNKS * (CHUNK_BYTES + TILE * 128) + 1024;
        check(cudaFuncSetAttribute(handoff_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem));
        handoff_kernel<<<1, 256, smem, s>>>((const uint4*)pa, (const uint4*)pb, po, a_lbo, a_sbo,
                                            b_lbo, b_sbo);
    } else {
        throw std::runtime_error("probe_wgmma: unknown test " + std::to_string(test));
    }
    check(cudaGetLastError());
}
"""

CPP_SRC = r"""
void launch_probe(int test, long long a, long long b, long long out, int a_lbo, int a_sbo,
                  int b_lbo, int b_sbo, long long stream);
"""


# The probe's wgmma forms: (name, N, A from registers, imm-trans-a, imm-trans-b). wgmma_ss (A and
# B K-major from shared memory, N = 32 or 64), wgmma_ss_t (A K-major, B transposed = MN-major;
# N = 64 or 256), wgmma_ss_tt (both MN-major, N = 256) and wgmma_rs_t (A from registers, B
# MN-major, N = 256).
WGMMA_FORMS = (
    ("wgmma_ss", 64, False, 0, 0),
    ("wgmma_ss", 32, False, 0, 0),
    ("wgmma_ss_t", 64, False, 0, 1),
    ("wgmma_ss_t", 256, False, 0, 1),
    ("wgmma_ss_tt", 256, False, 1, 1),
    ("wgmma_rs_t", 256, True, 0, 1),
)


@functools.cache
def _candidate():
    """The MLA split kernel's candidate module (kernels/mla_decode_value/, which cannot import
    this script): its wgmma wrapper generator and its sm_90a build serve the probe too."""
    path = Path(__file__).resolve().parents[1] / "kernels/mla_decode_value/cuda_mla_decode_value.py"
    spec = importlib.util.spec_from_file_location("cuda_mla_decode_value", path)
    candidate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(candidate)
    return candidate


def cuda_source() -> str:
    """CUDA_SRC with the inline-PTX calls of WGMMA_FORMS in place."""
    return CUDA_SRC.replace("@WGMMA@", _candidate().wgmma_wrappers(WGMMA_FORMS))


@functools.cache
def _ext():
    return _candidate().sm90a_extension(
        "probe_wgmma_sm90a_ext", CPP_SRC, cuda_source(), ["launch_probe"]
    )


# ---- CPU emulation (--selfcheck) -------------------------------------------------------------


# A swizzle of shared-memory byte addresses, as the emulation applies it on read.
Swizzle = Callable[[np.ndarray], np.ndarray]


def swizzle128(addr: np.ndarray) -> np.ndarray:
    """128B swizzle of a shared-memory byte address: 16-byte unit bits [4,7) ^= bits [7,10)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def encode_desc(addr: int, lbo: int, sbo: int) -> int:
    """Python mirror of CUDA_SRC's make_desc (Matrix Descriptor Format)."""
    enc = [(x & 0x3FFFF) >> 4 for x in (addr, lbo, sbo)]
    return enc[0] | enc[1] << 16 | enc[2] << 32 | SW128 << 62


def decode_desc(desc: int) -> tuple[int, int, int, int, int]:
    """(start, lbo, sbo, base offset, swizzle mode), the byte fields back from the descriptor."""
    start, lbo, sbo = (((desc >> lo) & 0x3FFF) << 4 for lo in (0, 16, 32))
    return start, lbo, sbo, (desc >> 49) & 7, desc >> 62


def fill_image(smem: np.ndarray, base: int, mat: np.ndarray) -> None:
    """Mirror of fill_sw128: writes mat (rows x cols element ids) into smem (one slot per 2
    bytes) at byte offset base, with the same index arithmetic as the CUDA loop."""
    rows, cols = mat.shape
    upr = cols // 8
    u = np.arange(rows * upr)
    row, c16 = u // upr, u % upr
    dst = base + (c16 // 8) * rows * 128 + row * 128 + (((c16 % 8) ^ (row & 7)) << 4)
    for e in range(8):  # the 8 bf16 of each 16-byte unit
        smem[(dst + 2 * e) // 2] = mat[row, c16 * 8 + e]


def kmajor_addrs(desc: int, mn: int, swizzle: Swizzle = swizzle128) -> np.ndarray:
    """Byte addresses of elements (i, kk), i < mn, kk < 16, of a K-major SW128 operand: canonical
    layout Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T)), T = 8 bf16 = 16 bytes, so row i at
    (i % 8) * 128 + (i // 8) * SBO and kk at 2 kk bytes from the start; LBO unused."""
    start, _lbo, sbo, base_off, swz = decode_desc(desc)
    assert swz == SW128 and base_off == 0
    i, kk = np.meshgrid(np.arange(mn), np.arange(16), indexing="ij")
    return swizzle(start + (i // 8) * sbo + (i % 8) * 128 + kk * 2)


def mnmajor_addrs(desc: int, n: int, swizzle: Swizzle = swizzle128) -> np.ndarray:
    """Byte addresses of elements (kk, j), kk < 16, j < n, of an MN-major SW128 operand:
    canonical layout Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), so j at
    (j % 64) * 2 + (j // 64) * LBO and kk at (kk % 8) * 128 + (kk // 8) * SBO bytes."""
    start, lbo, sbo, base_off, swz = decode_desc(desc)
    assert swz == SW128 and base_off == 0
    kk, j = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
    return swizzle(start + (j // 64) * lbo + (j % 64) * 2 + (kk // 8) * sbo + (kk % 8) * 128)


def emulate(base: int = 3 * 1024, mn_lbo: int = MNMAJOR_LBO, mn_sbo: int = MNMAJOR_SBO,
            swizzle: Swizzle = swizzle128) -> dict[str, int]:  # fmt: skip
    """Reads back every element every wgmma of the kernels would read, at the address that its
    descriptor gives under the PTX canonical layouts, from an emulated shared memory filled as
    fill_sw128 fills it (regions at `base`, which the kernels align to 1024 bytes). Returns the
    mismatches per test, 0 when the layout, descriptors and K-step advance agree. Element ids
    are distinct, so any misplaced read is caught."""
    ids = np.arange(ROWS * DIM).reshape(ROWS, DIM) + 1  # Q (and -ids: K), V = ids
    pid = np.arange(ROWS * 64).reshape(ROWS, 64) + 10**6  # P
    bad = {}
    smem = np.zeros((base + 2 * (DIM // 64) * CHUNK_BYTES) // 2, np.int64)  # 2 bytes a slot
    fill_image(smem, base + QK_REGIONS["q"], ids)
    fill_image(smem, base + QK_REGIONS["k"], -ids)
    n_bad = 0
    for ks in range(DIM // 16):  # as qk_kernel
        off = (ks // 4) * CHUNK_BYTES + (ks % 4) * 32
        da = encode_desc(base + QK_REGIONS["q"] + off, KMAJOR_LBO, KMAJOR_SBO)
        db = encode_desc(base + QK_REGIONS["k"] + off, KMAJOR_LBO, KMAJOR_SBO)
        got_a = smem[kmajor_addrs(da, 64, swizzle) // 2]  # A[i, kk] = Q[i, 16 ks + kk]
        got_b = smem[kmajor_addrs(db, 64, swizzle) // 2]  # B[kk, j] = K[j, 16 ks + kk]
        n_bad += int((got_a != ids[:, 16 * ks : 16 * ks + 16]).sum())
        n_bad += int((got_b != -ids[:, 16 * ks : 16 * ks + 16]).sum())
    bad["qk_kmajor_n64"] = n_bad
    smem = np.zeros((base + (1 + DIM // 64) * CHUNK_BYTES) // 2, np.int64)
    fill_image(smem, base + PV_REGIONS["p"], pid)
    fill_image(smem, base + PV_REGIONS["v"], ids)
    for n in (64, 256):  # as pv_kernel<N, false>
        n_bad = 0
        for n0 in range(0, DV, n):
            for ks in range(4):
                da = encode_desc(base + PV_REGIONS["p"] + ks * 32, KMAJOR_LBO, KMAJOR_SBO)
                vb = base + PV_REGIONS["v"] + (n0 // 64) * CHUNK_BYTES + ks * 16 * 128
                db = encode_desc(vb, mn_lbo, mn_sbo)
                got_a = smem[kmajor_addrs(da, 64, swizzle) // 2]  # A[i, kk] = P[i, 16 ks + kk]
                got_b = smem[mnmajor_addrs(db, n, swizzle) // 2]  # B[kk, j] = V[16 ks + kk, n0 + j]
                n_bad += int((got_a != pid[:, 16 * ks : 16 * ks + 16]).sum())
                n_bad += int((got_b != ids[16 * ks : 16 * ks + 16, n0 : n0 + n]).sum())
        bad[f"pv_ss_n{n}"] = n_bad
    bad["tile32_chain_ss_tt"] = _emulate_tile32(base, swizzle)
    return bad


def _emulate_tile32(base: int, swizzle: Swizzle) -> int:
    """As emulate, for tile32_kernel: Q and a 32-row tile read K-major, then P stored by the
    kernel's formula into the tile's rope chunk and read back as an MN-major A operand, and V
    read MN-major with the 32-row chunks' LBO. Returns the mismatches."""
    ids = np.arange(ROWS * DIM).reshape(ROWS, DIM) + 1
    kt = -ids[:TILE]
    kbase = base + (DIM // 64) * CHUNK_BYTES
    smem = np.zeros((kbase + (DIM // 64) * TILE * 128) // 2, np.int64)
    fill_image(smem, base, ids)
    fill_image(smem, kbase, kt)
    n_bad = 0
    for ks in range(DIM // 16):
        da = encode_desc(base + (ks // 4) * CHUNK_BYTES + (ks % 4) * 32, KMAJOR_LBO, KMAJOR_SBO)
        db = encode_desc(kbase + (ks // 4) * TILE * 128 + (ks % 4) * 32, KMAJOR_LBO, KMAJOR_SBO)
        n_bad += int(
            (smem[kmajor_addrs(da, ROWS, swizzle) // 2] != ids[:, 16 * ks : 16 * ks + 16]).sum()
        )
        n_bad += int(
            (smem[kmajor_addrs(db, TILE, swizzle) // 2] != kt[:, 16 * ks : 16 * ks + 16]).sum()
        )
    pbase = kbase + (DIM // 64 - 1) * TILE * 128  # the rope chunk
    pt = np.arange(ROWS * TILE).reshape(ROWS, TILE) + 10**7  # P[m, k]
    m, k = np.meshgrid(np.arange(ROWS), np.arange(TILE), indexing="ij")
    smem[(pbase + k * 128 + (((m // 8) ^ (k % 8)) << 4) + (m % 8) * 2) // 2] = pt
    for n0 in (0, 256):
        for ks in range(TILE // 16):
            da = encode_desc(pbase + ks * 16 * 128, TILE_LBO, MNMAJOR_SBO)
            db = encode_desc(kbase + (n0 // 64) * TILE * 128 + ks * 16 * 128, TILE_LBO, MNMAJOR_SBO)
            got_a = smem[mnmajor_addrs(da, ROWS, swizzle) // 2]  # (kk, m) = P[m, 16 ks + kk]
            got_b = smem[mnmajor_addrs(db, 256, swizzle) // 2]  # (kk, j) = V[16 ks + kk, n0 + j]
            n_bad += int((got_a != pt[:, 16 * ks : 16 * ks + 16].T).sum())
            n_bad += int((got_b != kt[16 * ks : 16 * ks + 16, n0 : n0 + 256]).sum())
    return n_bad


def fragment_maps_ok() -> bool:
    """The accumulator store (m64nNk16 D) and the register A fragment index arithmetic of
    CUDA_SRC each cover their tile exactly once."""
    tid = np.arange(128)
    lane, warp = tid % 32, tid // 32
    row, col = 16 * warp + lane // 4, 2 * (lane % 4)
    ok = True
    for n in (64, 256):
        seen = np.zeros((64, n), int)
        for j in range(n // 8):
            for dr, dc in ((0, 0), (0, 1), (8, 0), (8, 1)):
                np.add.at(seen, (row + dr, col + 8 * j + dc), 1)
        ok &= bool((seen == 1).all())
    seen = np.zeros((64, 16), int)
    for dr, dc in ((0, 0), (8, 0), (0, 8), (8, 8)):  # a[0..3], two bf16 each
        for e in (0, 1):
            np.add.at(seen, (row + dr, col + dc + e), 1)
    return ok and bool((seen == 1).all())


def accumulator_is_a_fragment() -> bool:
    """qk_pv_kernel's packing a[s][r] = (d[8s + 2r], d[8s + 2r + 1]) puts, for every thread, the
    accumulator elements of S at exactly the (row, column) of load_a_frag's A fragment for K step
    s (so S's registers feed the next wgmma without a trip through shared memory)."""
    tid = np.arange(128)
    lane, warp = tid % 32, tid // 32
    row, col = 16 * warp + lane // 4, 2 * (lane % 4)
    acc = {}  # d index -> (row, col) of the m64n64 accumulator
    for j in range(8):
        for e, (dr, dc) in enumerate(((0, 0), (0, 1), (8, 0), (8, 1))):
            acc[4 * j + e] = (row + dr, col + 8 * j + dc)
    ok = True
    for s in range(4):
        for r, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):  # load_a_frag's a[r]
            for half in (0, 1):
                want = (row + dr, 16 * s + col + dc + half)
                got = acc[8 * s + 2 * r + half]
                ok &= bool((got[0] == want[0]).all() and (got[1] == want[1]).all())
    return ok


# Wrong layouts the emulation must catch, or its check is vacuous: name -> (emulate's arguments,
# the test whose read-back must then mismatch).
NEGATIVE_CONTROLS = {
    "MN-major LBO/SBO swapped": ({"mn_lbo": MNMAJOR_SBO, "mn_sbo": MNMAJOR_LBO}, "pv_ss_n256"),
    "no swizzle on read": ({"swizzle": lambda addr: addr}, "qk_kmajor_n64"),
    "base 128 B off 1024": ({"base": 3 * 1024 + 128}, "qk_kmajor_n64"),
}


def selfcheck() -> bool:
    """Runs the CPU emulation and its negative controls, printing a line each; True if all
    pass (every control must be caught)."""
    results = emulate()
    ok = all(v == 0 for v in results.values())
    for name, n_bad in results.items():
        print(f"selfcheck {name:22s} mismatches {n_bad:6d} {'PASS' if n_bad == 0 else 'FAIL'}")
    frag = fragment_maps_ok() and accumulator_is_a_fragment()
    print(f"selfcheck {'fragment maps':22s} {'PASS' if frag else 'FAIL'}")
    # Negative controls: each must break the emulated read-back, or the check is vacuous.
    controls = {name: emulate(**change)[test] for name, (change, test) in NEGATIVE_CONTROLS.items()}
    for name, n_bad in controls.items():
        print(
            f"selfcheck control {name:26s} mismatches {n_bad:6d} "
            f"{'PASS (detected)' if n_bad else 'FAIL (not detected)'}"
        )
    return ok and frag and all(controls.values())


# ---- GPU run ---------------------------------------------------------------------------------

TESTS = [  # name, launch id, A (lbo, sbo), B (lbo, sbo), must pass (False: must fail)
    ("qk_kmajor_n64", 0, (KMAJOR_LBO, KMAJOR_SBO), (0, 0), True),
    ("pv_ss_n64", 1, (KMAJOR_LBO, KMAJOR_SBO), (MNMAJOR_LBO, MNMAJOR_SBO), True),
    ("pv_ss_n256", 2, (KMAJOR_LBO, KMAJOR_SBO), (MNMAJOR_LBO, MNMAJOR_SBO), True),
    ("pv_rs_n256", 3, (KMAJOR_LBO, KMAJOR_SBO), (MNMAJOR_LBO, MNMAJOR_SBO), True),
    ("qk_pv_chain_rs", 4, (KMAJOR_LBO, KMAJOR_SBO), (MNMAJOR_LBO, MNMAJOR_SBO), True),
    ("tile32_chain_ss_tt", 5, (KMAJOR_LBO, KMAJOR_SBO), (TILE_LBO, MNMAJOR_SBO), True),
    ("handoff_two_warpgroups", 6, (KMAJOR_LBO, KMAJOR_SBO), (TILE_LBO, MNMAJOR_SBO), True),
    ("diag_pv_ss_n256_swapped", 2, (KMAJOR_LBO, KMAJOR_SBO), (MNMAJOR_SBO, MNMAJOR_LBO), False),
]


# The chained tests: their output is O, then that many copies of S (the last one the S that P
# was made from).
CHAINED = {4: 1, 5: 1, 6: 2}


def run_gpu() -> tuple[bool, list[dict]]:
    """Builds the extension, runs every test of TESTS once on the current GPU and prints a line
    each; returns whether every test went as it must, and one result dict a test."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(ROWS, DIM, generator=gen).to(torch.bfloat16)
    kv = torch.randn(ROWS, DIM, generator=gen).to(torch.bfloat16)
    p = torch.randn(ROWS, 64, generator=gen).to(torch.bfloat16)
    if not all(bool((t != 0).all()) for t in (q, kv, p)):
        raise RuntimeError("the probe's inputs must have no zeros: choose another seed")
    refs = {  # float64 on the CPU: exact products of the bf16 inputs, no TF32
        0: (q.double() @ kv.double().T, DIM),
        1: (p.double() @ kv[:, :DV].double(), 64),
        2: (q.double() @ kv[:TILE].double().T, DIM),
        3: (q[:, :DV].double() @ kv[:TILE, :DV].double().T, DV),
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    qd, kvd, pd = q.to(dev), kv.to(dev), p.to(dev)
    kv32d = kvd[:TILE].contiguous()
    torch_fp32 = {  # torch's own float32 product on this GPU, for scale
        0: (qd.float() @ kvd.float().T).cpu().double(),
        1: (pd.float() @ kvd[:, :DV].float()).cpu().double(),
        2: (qd.float() @ kv32d.float().T).cpu().double(),
    }
    ext = _ext()
    stream = torch.cuda.current_stream().cuda_stream
    rows, all_ok = [], True
    for name, test, (a_lbo, a_sbo), (b_lbo, b_sbo), must_pass in TESTS:
        which = 0 if test in (0, 4) else 2 if test in (5, 6) else 1
        ref, k = refs[which]
        width = DV + ref.shape[1] * CHAINED[test] if test in CHAINED else ref.shape[1]
        out = torch.full((ROWS, width), float("nan"), device=dev)
        a, b = (qd, kvd) if test in (0, 4) else (qd, kv32d) if test in (5, 6) else (pd, kvd)
        tol = 1e-3 * math.sqrt(k)
        row = {"test": name, "K": k, "N_out": out.shape[1], "atol": tol, "must_pass": must_pass,
               "a_lbo": a_lbo, "a_sbo": a_sbo, "b_lbo": b_lbo, "b_sbo": b_sbo}  # fmt: skip
        try:
            ext.launch_probe(
                test, a.data_ptr(), b.data_ptr(), out.data_ptr(), a_lbo, a_sbo, b_lbo, b_sbo,
                stream,
            )  # fmt: skip
            torch.cuda.synchronize()
            if test in CHAINED:  # O against bf16(S as the GPU computed it) V; S against Q K^T
                n = ref.shape[1]
                s_gpu = out[:, -n:].to(torch.bfloat16).cpu().double()
                again = [refs[3][0]] if test == 6 else []  # S2: the latent columns alone
                ref = torch.cat([s_gpu @ kv[:n, :DV].double(), *again, ref], dim=1)
            err = (out.cpu().double() - ref).abs()
            n_nan = int(err.isnan().sum())  # the output starts as NaN: unwritten elements show
            max_abs = float(err.nan_to_num(float("inf")).max())
            row |= {
                "max_abs_err": max_abs if n_nan == 0 else None,
                "max_rel_err": max_abs / float(ref.abs().max()) if n_nan == 0 else None,
                "nan_count": n_nan,
                "torch_fp32_max_abs_err": float((torch_fp32[which] - refs[which][0]).abs().max()),
                "pass": n_nan == 0 and max_abs <= tol,
            }
        except Exception as exc:  # a launch or device error: this test fails, report it
            row |= {"max_abs_err": None, "max_rel_err": None, "pass": False, "error": str(exc)}
        rows.append(row)
        if must_pass:
            all_ok &= row["pass"]
        else:  # a numerical miss, not a launch error or unwritten output
            all_ok &= "error" not in row and row["nan_count"] == 0 and not row["pass"]
        verdict = "PASS" if row["pass"] else "FAIL"
        if not must_pass:
            verdict += " (diagnostic, must FAIL)"
        print(
            f"{name:24s} K={k:3d} N={out.shape[1]:3d} max_abs_err={_sci(row['max_abs_err'])} "
            f"max_rel_err={_sci(row['max_rel_err'])} atol={tol:.4f} "
            f"torch_fp32_err={_sci(row.get('torch_fp32_max_abs_err'))} "
            f"nan={row.get('nan_count', 'n/a')} {verdict}"
            + (f" error={row['error']}" if "error" in row else "")
        )
    return all_ok, rows


def _sci(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--selfcheck", action="store_true", help="CPU emulation only")
    parser.add_argument("--emit-cuda", metavar="FILE", help="write the CUDA source and exit")
    args = parser.parse_args(argv)
    if args.emit_cuda:
        with open(args.emit_cuda, "w") as f:
            f.write(cuda_source())
        return 0
    if args.selfcheck:
        return 0 if selfcheck() else 1
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to probe (use --selfcheck for the CPU emulation)")
        return 2
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        print(f"needs an sm_90 (Hopper) GPU for wgmma with sm_90a, got sm_{cap[0]}{cap[1]}")
        return 2
    print(f"device: {torch.cuda.get_device_name()}")
    if not selfcheck():
        print("selfcheck failed: the GPU run would test inconsistent layouts")
        return 1
    try:
        all_ok, rows = run_gpu()
    except Exception as exc:  # the build, most likely
        print(f"FAIL: {type(exc).__name__}: {exc}")
        all_ok, rows = False, [{"error": f"{type(exc).__name__}: {exc}"}]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "all_pass": all_ok, "tests": rows},
                f,
                indent=2,
            )
    print("ALL PASS" if all_ok else "SOME TESTS FAILED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

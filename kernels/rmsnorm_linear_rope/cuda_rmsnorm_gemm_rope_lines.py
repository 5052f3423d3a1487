"""RMSNorm, the q/k/v projection and rope in one CUDA C++ kernel (torch's load_inline) for up to
16 rows at a time, as cuda_rmsnorm_gemm_rope_cluster.py (split-K slices added through a thread
block cluster's distributed shared memory), but with W streamed in whole 128-byte lines: a
chunk is 64 of k, and each cp.async instruction of a warp copies four rows' whole lines (lane l
vector l % 8 of row l / 8), where the cluster kernel's copies take half lines of eight rows. The
MMA fragments, which no longer lie in the lane that copied them, come out of shared memory
through ldmatrix.

The products run on tensor cores (`mma.sync.m16n8k16`, bfloat16 in, float32 accumulated): a
tile's 16 rows of W are the MMA's A operand, x g (x's rows 0-7, then 8-15) its B operand, in k's
own order. A tile's slot holds its 16 rows of 8 vectors, vector v of row i at i * 8 + (v ^ i %
8), so the eight rows of an ldmatrix matrix lie in different banks; x's 16 rows are held the
same way and g's line after them. Each warp streams its chunks through a ring of `stages` slots
with cp.async (zeros past K, the rows or M) and meets only itself: __syncwarp before a slot is
refilled and after its copies land. x g is formed per k16 step in float32 and rounded to
bfloat16 (as the eager norm rounds), x's squares summed from the same fragments (each element of
x lies in one lane once), so the norm's scale comes at the end.

A q/k tile is rows j0..j0+7 and j0+d/2..j0+d/2+7 of one head, the pairs rope mixes, so a lane's
accumulator holds both halves of its pairs (C fragment rows g and g + 8); a v tile is 16
consecutive rows. A block takes `n_tiles` tiles and one of `split_k` slices of K, its `k_warps`
warps splitting the slice by chunks; the `split_k` blocks of the same tiles form a cluster.
Each block adds its warps' partials in shared memory, the cluster synchronises, and block r of
the cluster adds the r-th share of the tiles' outputs across the cluster's shared memories,
scales, rotates and writes them; a second cluster barrier keeps every block's shared memory
alive until the others have read it. Nothing is kept between calls.

Launched with `cudaLaunchKernelEx` on torch's current stream (so CUDA graphs capture it), with
the cluster's shape and programmatic dependent launch: a warp copies its first W chunks, which
nothing earlier in the stream writes, before `griddepcontrol.wait`; x, g, cos and sin are read,
and anything written, only after it, and right after it the kernel lets the next one launch.
bfloat16 only, on sm_90 or later, with K a multiple of 8, head_dim a multiple of 16, v's rows a
multiple of 16 and 16-byte aligned x, g and weights.
"""

import functools

import torch
import torch.utils.cpp_extension

LANGUAGE = "cuda"
PARAMS = {
    "split_k": [1, 2, 4, 8],
    "n_tiles": [2, 4],
    "k_warps": [2, 4],
    "stages": [2, 3],
}
ROWS_PER_LAUNCH = 16
EPS = 1e-6

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <stdexcept>
#include <string>

namespace cg = cooperative_groups;

// 16 bytes from global to shared memory, through L2 only; zeros where `bytes` is 0.
__device__ __forceinline__ void copy16(uint4* dst, const uint4* src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8 x 8 matrices of 16-bit values from shared memory, lane l giving the address of row
// l % 8 of matrix l / 8; lane (g, t) gets (row g, columns 2t, 2t + 1) of each.
__device__ __forceinline__ uint4 ldmatrix4(const uint4* row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    uint4 r;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(a)
                 : "memory");
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

// Two bfloat16 of x times two of g, in float32, rounded to bfloat16; x's squares summed.
__device__ __forceinline__ unsigned xg_pair(unsigned x, unsigned g, float& squares) {
    const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
    const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&g));
    squares = fmaf(xf.x, xf.x, squares);
    squares = fmaf(xf.y, xf.y, squares);
    const __nv_bfloat162 r = __floats2bfloat162_rn(xf.x * gf.x, xf.y * gf.y);
    return *reinterpret_cast<const unsigned*>(&r);
}

// The first of the W rows that row i (0-7) of `tile` takes; row i + 8 of the tile is d/2
// further for a q/k tile (rows j and j + d/2 of one head, the pair rope mixes), 8 for v.
__device__ __forceinline__ long long tile_row(long long tile, int i, long long qk_tiles,
                                              int half) {
    const int per_head = half / 8;
    return tile < qk_tiles ? (tile / per_head) * 2 * half + (tile % per_head) * 8 + i
                           : (tile - qk_tiles) * 16 + i;
}

// A chunk is 64 of k: 8 vectors of 16 bytes, one 128-byte line, of each row. Lane l copies
// vector l % 8 of rows l / 8, 4 + l / 8, 8 + l / 8 and 12 + l / 8 of each 16-row tile, so a
// copy instruction takes four whole lines. A tile's slot holds its 16 rows of 8 vectors, vector
// v of row i at i * 8 + (v ^ i % 8), so the 8 rows an ldmatrix matrix reads fall in 8 different
// 16-byte bank groups. A copy that moves nothing points at `none`, the first 16 bytes of g
// (K >= 8), so that every address is in bounds.
constexpr int kLine = 8;
constexpr int kTileVectors = 16 * kLine;

__device__ __forceinline__ int swizzled(int i, int v) { return i * kLine + (v ^ (i & 7)); }

template <int NT>
struct Rows {
    const uint4* w[NT][2];   // rows l / 8 and 8 + l / 8 of each tile, at vector l % 8
    bool ok[NT][4];          // rows l / 8, 4 + l / 8, 8 + l / 8, 12 + l / 8 exist
};

template <int NT>
__device__ __forceinline__ Rows<NT> tile_rows(long long tile0, int lane, long long qk_tiles,
                                              int half, long long n_qk, long long n_v,
                                              const uint4* wqk, const uint4* wv, int k8) {
    Rows<NT> rows;
    const int i = lane >> 3;
    #pragma unroll
    for (int r = 0; r < NT; ++r) {
        const long long tile = tile0 + r;
        const bool is_qk = tile < qk_tiles;
        const long long a = tile_row(tile, i, qk_tiles, half);
        const long long b = a + (is_qk ? half : 8), n_out = is_qk ? n_qk : n_v;
        const uint4* base = is_qk ? wqk : wv;
        rows.ok[r][0] = a < n_out;
        rows.ok[r][1] = a + 4 < n_out;
        rows.ok[r][2] = b < n_out;
        rows.ok[r][3] = b + 4 < n_out;
        rows.w[r][0] = base + (rows.ok[r][0] ? a : 0) * k8 + (lane & 7);
        rows.w[r][1] = base + (rows.ok[r][2] ? b : 0) * k8 + (lane & 7);
    }
    return rows;
}

// A warp's ring slot of one chunk: its NT tiles' W, then x's 16 rows, then g's line.
template <int NT>
__host__ __device__ constexpr int slot_vectors() { return (NT + 1) * kTileVectors + kLine; }

template <int NT>
__device__ __forceinline__ void copy_w(uint4* slot, int c, int chunk_stop, int k8, int lane,
                                       const Rows<NT>& rows, long long k8_4,
                                       const uint4* none) {
    const int v = kLine * c;
    const int i = lane >> 3, e = lane & 7;
    const bool live = c < chunk_stop && v + e < k8;
    #pragma unroll
    for (int r = 0; r < NT; ++r)
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            const bool on = live && rows.ok[r][q];
            const uint4* src = rows.w[r][q >> 1] + ((q & 1) ? k8_4 : 0) + v;
            copy16(slot + r * kTileVectors + swizzled(4 * q + i, e), on ? src : none,
                   on ? 16 : 0);
        }
}

template <int NT>
__device__ __forceinline__ void copy_x(uint4* slot, int c, int chunk_stop, int k8, int lane,
                                       const uint4* x_row, long long k8_4, int rows_left,
                                       const uint4* gp, const uint4* none) {
    const int v = kLine * c;
    const int i = lane >> 3, e = lane & 7;
    const bool live = c < chunk_stop && v + e < k8;
    uint4* xs = slot + NT * kTileVectors;
    #pragma unroll
    for (int q = 0; q < 4; ++q) {
        const bool on = live && 4 * q + i < rows_left;
        copy16(xs + swizzled(4 * q + i, e), on ? x_row + q * k8_4 + v : none, on ? 16 : 0);
    }
    if (lane < kLine) copy16(xs + kTileVectors + e, live ? gp + v : none, live ? 16 : 0);
}

template <int NT, int KW, int STAGES>
__global__ void __launch_bounds__(32 * KW) rmsnorm_gemm_rope_lines(
    const uint4* x, const uint4* g_vec, const uint4* __restrict__ wqk,
    const uint4* __restrict__ wv, const float* cos_, const float* sin_,
    __nv_bfloat16* qk, __nv_bfloat16* v_out, int m, int m0, int k8, int chunks_per_split,
    long long n_qk, long long n_v, int half, float eps)
{
    extern __shared__ uint4 ring[];  // [KW][STAGES][slot_vectors<NT>()]
    __shared__ float sums[NT][2][32][4];
    __shared__ float sums_sq[16];

    cg::cluster_group cluster = cg::this_cluster();
    const int splits = (int)cluster.num_blocks();
    const int rank = (int)cluster.block_rank();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const long long qk_tiles = n_qk / 16;
    const long long tile0 = (long long)blockIdx.x * NT;
    const long long k8_4 = 4ll * k8;
    const Rows<NT> rows = tile_rows<NT>(tile0, lane, qk_tiles, half, n_qk, n_v, wqk, wv, k8);

    const int chunks = (k8 + kLine - 1) / kLine;
    const int chunk_start = blockIdx.y * chunks_per_split;
    const int chunk_stop = min(chunk_start + chunks_per_split, chunks);
    constexpr int kSlot = slot_vectors<NT>();
    uint4* my_ring = ring + warp * STAGES * kSlot;
    // Warp w takes chunks w, w + KW, ... of the slice; step s is chunk chunk_start + w + s KW.
    const int c0 = chunk_start + warp;

    // The first STAGES - 1 steps' W, one group each, before the wait: nothing earlier in the
    // stream writes W. x, g, cos and sin, which earlier kernels write, only after it.
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        copy_w<NT>(my_ring + s * kSlot, c0 + s * KW, chunk_stop, k8, lane, rows, k8_4, g_vec);
        commit();
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    const int rows_left = m - m0;
    const int xi = lane >> 3;
    const uint4* x_row = x + (long long)(xi < rows_left ? m0 + xi : 0) * k8 + (lane & 7);
    const uint4* gp = g_vec + (lane & 7);
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        copy_x<NT>(my_ring + s * kSlot, c0 + s * KW, chunk_stop, k8, lane, x_row, k8_4,
                   rows_left, gp, g_vec);
    commit();

    float acc[NT][2][4];
    #pragma unroll
    for (int r = 0; r < NT; ++r)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int j = 0; j < 4; ++j) acc[r][h][j] = 0.f;
    float sq0 = 0.f, sq1 = 0.f;

    // ldmatrix addresses at k16 step j: A's four matrices are a tile's (rows 0-7, 8-15) x
    // (vectors 2j, 2j + 1); B's are x's rows 0-7 at 2j and 2j + 1, then rows 8-15 at both.
    const int mat = lane >> 3, mrow = lane & 7;
    const int a_row = (mat & 1) * 8 + mrow, a_vec = mat >> 1;
    const int b_row = (mat >> 1) * 8 + mrow, b_vec = mat & 1;

    for (int s = 0; c0 + s * KW < chunk_stop; ++s) {
        const int ahead = s + STAGES - 1;
        uint4* refill = my_ring + (ahead % STAGES) * kSlot;
        __syncwarp();  // every lane is done reading the slot it refills (step s - 1's)
        copy_w<NT>(refill, c0 + ahead * KW, chunk_stop, k8, lane, rows, k8_4, g_vec);
        copy_x<NT>(refill, c0 + ahead * KW, chunk_stop, k8, lane, x_row, k8_4, rows_left, gp,
                   g_vec);
        commit();
        // Groups so far: the W of steps 0..STAGES-2, their x, then one per step. Step s needs
        // all but the last min(s + 1, STAGES - 1).
        if (s + 1 >= STAGES - 1) wait_groups<STAGES - 1>();
        else if (s == 0) wait_groups<1>();
        else wait_groups<2>();
        __syncwarp();  // the other lanes' copies of this step are visible
        const uint4* slot = my_ring + (s % STAGES) * kSlot;
        const uint4* xs = slot + NT * kTileVectors;
        const unsigned* gs = reinterpret_cast<const unsigned*>(xs + kTileVectors);
        #pragma unroll
        for (int k16 = 0; k16 < kLine / 2; ++k16) {
            const uint4 xb = ldmatrix4(xs + swizzled(b_row, 2 * k16 + b_vec));
            const unsigned g0 = gs[(2 * k16) * 4 + t], g1 = gs[(2 * k16 + 1) * 4 + t];
            const unsigned b00 = xg_pair(xb.x, g0, sq0), b01 = xg_pair(xb.y, g1, sq0);
            const unsigned b10 = xg_pair(xb.z, g0, sq1), b11 = xg_pair(xb.w, g1, sq1);
            #pragma unroll
            for (int r = 0; r < NT; ++r) {
                const uint4 a = ldmatrix4(slot + r * kTileVectors +
                                          swizzled(a_row, 2 * k16 + a_vec));
                mma_bf16(acc[r][0], a.x, a.y, a.z, a.w, b00, b01);
                mma_bf16(acc[r][1], a.x, a.y, a.z, a.w, b10, b11);
            }
        }
    }
    wait_groups<0>();

    // The four lanes of a row hold its squares over different k.
    sq0 += __shfl_xor_sync(0xffffffffu, sq0, 1);
    sq0 += __shfl_xor_sync(0xffffffffu, sq0, 2);
    sq1 += __shfl_xor_sync(0xffffffffu, sq1, 1);
    sq1 += __shfl_xor_sync(0xffffffffu, sq1, 2);
    // The warps' partials, in the ring's memory once every warp is done with it.
    __syncthreads();
    float* part = reinterpret_cast<float*>(ring);  // [KW][NT][2][32][4]
    float* part_sq = part + KW * NT * 2 * 32 * 4;  // [KW][16]
    #pragma unroll
    for (int r = 0; r < NT; ++r)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int j = 0; j < 4; ++j) part[(((warp * NT + r) * 2 + h) * 32 + lane) * 4 + j] =
                acc[r][h][j];
    if (t == 0) {
        part_sq[warp * 16 + g] = sq0;
        part_sq[warp * 16 + g + 8] = sq1;
    }
    __syncthreads();
    constexpr int kTile = NT * 2 * 32 * 4;
    for (int e = threadIdx.x; e < kTile + 16; e += 32 * KW) {  // added in a fixed order
        float s = 0.f;
        if (e < kTile) {
            #pragma unroll
            for (int w = 0; w < KW; ++w) s += part[w * kTile + e];
            (&sums[0][0][0][0])[e] = s;
        } else {
            #pragma unroll
            for (int w = 0; w < KW; ++w) s += part_sq[w * 16 + e - kTile];
            sums_sq[e - kTile] = s;
        }
    }
    cluster.sync();

    // Block `rank` finishes its share of the tiles' output pairs: a C fragment's element j of
    // lane (g, t) is (W row g + 8 (j / 2), x row 2t + j % 2) of its 16 x 8 tile, so elements j
    // and j + 2 are the two halves rope mixes (or two v rows 8 apart).
    const int pairs = NT * 2 * 32 * 2;
    const int share = (pairs + splits - 1) / splits;
    const int first = rank * share, last = min(first + share, pairs);
    for (int p = first + (int)threadIdx.x; p < last; p += 32 * KW) {
        const int jj = p & 1, l = (p >> 1) & 31, h = (p >> 6) & 1, r = p >> 7;
        const int mm = 8 * h + 2 * (l & 3) + jj;
        const int row = m0 + mm;
        const long long tile = tile0 + r;
        if (row >= m || tile >= qk_tiles + n_v / 16) continue;  // past M, or a tile past v
        float za = 0.f, zb = 0.f, squares = 0.f;
        for (int q = 0; q < splits; ++q) {
            const float* other = cluster.map_shared_rank(&sums[r][h][l][0], q);
            za += other[jj];
            zb += other[jj + 2];
            squares += *cluster.map_shared_rank(&sums_sq[mm], q);
        }
        const float scale = rsqrtf(squares / (float)(8 * k8) + eps);
        za *= scale;
        zb *= scale;
        const long long a = tile_row(tile, l >> 2, qk_tiles, half);
        if (tile < qk_tiles) {
            const int j = (int)(tile % (half / 8)) * 8 + (l >> 2);  // the pair's place in the head
            const float c_ = cos_[(long long)row * half + j], s_ = sin_[(long long)row * half + j];
            qk[(long long)row * n_qk + a] = __float2bfloat16_rn(za * c_ - zb * s_);
            qk[(long long)row * n_qk + a + half] = __float2bfloat16_rn(zb * c_ + za * s_);
        } else {
            v_out[(long long)row * n_v + a] = __float2bfloat16_rn(za);
            v_out[(long long)row * n_v + a + 8] = __float2bfloat16_rn(zb);
        }
    }
    cluster.sync();  // no block leaves while another may still read its shared memory
}

template <int NT, int KW, int STAGES>
static void launch(dim3 grid, int splits, cudaStream_t stream, const void* x, const void* g,
                   const void* wqk, const void* wv, const float* cos_, const float* sin_,
                   void* qk, void* v, int m, int m0, int k8, int chunks_per_split,
                   long long n_qk, long long n_v, int half, float eps) {
    auto* kernel = rmsnorm_gemm_rope_lines<NT, KW, STAGES>;
    const int ring_bytes = KW * STAGES * slot_vectors<NT>() * 16;
    // Once per device, at its first launch (torch warms up before any graph capture).
    static unsigned long long sized = 0;
    int device = 0;
    cudaGetDevice(&device);
    if (!(sized >> device & 1ull)) {
        cudaError_t err = cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_bytes);
        if (err != cudaSuccess) {
            cudaGetLastError();
            throw std::runtime_error(std::string("rmsnorm_gemm_rope_lines: ") +
                                     cudaGetErrorString(err));
        }
        sized |= 1ull << device;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(32 * KW, 1, 1);
    config.dynamicSmemBytes = ring_bytes;
    config.stream = stream;
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 1;
    attrs[0].val.clusterDim.y = splits;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attrs;
    config.numAttrs = 2;
    cudaError_t err = cudaLaunchKernelEx(
        &config, kernel, (const uint4*)x, (const uint4*)g, (const uint4*)wqk, (const uint4*)wv,
        cos_, sin_, (__nv_bfloat16*)qk, (__nv_bfloat16*)v, m, m0, k8, chunks_per_split, n_qk,
        n_v, half, eps);
    if (err != cudaSuccess) {
        cudaGetLastError();  // not left for torch's next launch check to blame on another op
        throw std::runtime_error(std::string("rmsnorm_gemm_rope_lines: ") +
                                 cudaGetErrorString(err));
    }
}

void launch_rmsnorm_gemm_rope_lines(int n_tiles, int k_warps, int stages, int grid_x,
                                      int splits, long long stream, long long x, long long g,
                                      long long wqk, long long wv, long long cos_,
                                      long long sin_, long long qk, long long v, int m, int m0,
                                      int k8, int chunks_per_split, long long n_qk,
                                      long long n_v, int half, double eps) {
    const dim3 grid(grid_x, splits, 1);
    const cudaStream_t s = (cudaStream_t)stream;
    const float* c = (const float*)cos_;
    const float* sn = (const float*)sin_;
#define LAUNCH(NT_, KW_, S_)                                                                   \
    if (n_tiles == NT_ && k_warps == KW_ && stages == S_) {                                    \
        launch<NT_, KW_, S_>(grid, splits, s, (const void*)x, (const void*)g, (const void*)wqk, \
                             (const void*)wv, c, sn, (void*)qk, (void*)v, m, m0, k8,           \
                             chunks_per_split, n_qk, n_v, half, (float)eps);                   \
        return;                                                                                \
    }
    @BUILDS@
#undef LAUNCH
    throw std::runtime_error("rmsnorm_gemm_rope_lines: no build for n_tiles " +
                             std::to_string(n_tiles) + ", k_warps " + std::to_string(k_warps) +
                             ", stages " + std::to_string(stages));
}
""".replace(
    "@BUILDS@",  # one build for each (n_tiles, k_warps, stages) of PARAMS
    " ".join(
        f"LAUNCH({nt}, {kw}, {st})"
        for nt in PARAMS["n_tiles"]
        for kw in PARAMS["k_warps"]
        for st in PARAMS["stages"]
    ),
)

CPP_SRC = r"""
void launch_rmsnorm_gemm_rope_lines(int n_tiles, int k_warps, int stages, int grid_x,
                                      int splits, long long stream, long long x, long long g,
                                      long long wqk, long long wv, long long cos_,
                                      long long sin_, long long qk, long long v, int m, int m0,
                                      int k8, int chunks_per_split, long long n_qk,
                                      long long n_v, int half, double eps);
"""


@functools.cache
def _ext():
    return torch.utils.cpp_extension.load_inline(
        name="rmsnorm_gemm_rope_lines_ext",
        cpp_sources=CPP_SRC,
        cuda_sources=CUDA_SRC,
        functions=["launch_rmsnorm_gemm_rope_lines"],
        extra_cuda_cflags=["-O3"],
        verbose=False,
    )


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w_qk: torch.Tensor,
    w_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    split_k: int = 4,
    n_tiles: int = 4,
    k_warps: int = 2,
    stages: int = 3,
) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    half = cos.shape[1]
    n_qk, n_v = w_qk.shape[0], w_v.shape[0]
    if w_qk.shape[1] != k or w_v.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w_qk and w_v must be (n, {k}) and g ({k},), got {tuple(w_qk.shape)}, "
            f"{tuple(w_v.shape)}, {tuple(g.shape)}"
        )
    if cos.shape != (m, half) or sin.shape != (m, half) or not half or n_qk % (2 * half):
        raise ValueError(
            f"cos and sin must be ({m}, d/2) with w_qk's rows a multiple of d, got "
            f"{tuple(cos.shape)}, {tuple(sin.shape)}, {n_qk} rows"
        )
    if any(t.dtype != torch.bfloat16 for t in (x, g, w_qk, w_v)):
        raise TypeError(f"bfloat16 only, got {x.dtype}, {g.dtype}, {w_qk.dtype}, {w_v.dtype}")
    if k == 0 or k % 8:
        raise ValueError(f"needs K a positive multiple of 8, got {k}")
    if half % 8:
        raise ValueError(f"needs head_dim a multiple of 16, got {2 * half}")
    if n_v % 16:
        raise ValueError(f"needs v's rows a multiple of 16, got {n_v}")
    if split_k not in PARAMS["split_k"] or any(
        value not in PARAMS[name]
        for name, value in (("n_tiles", n_tiles), ("k_warps", k_warps), ("stages", stages))
    ):
        raise ValueError(
            f"split_k (a cluster of at most 8), n_tiles, k_warps and stages must be among "
            f"{PARAMS}, got {split_k}, {n_tiles}, {k_warps}, {stages}"
        )
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] < 9:
        raise ValueError("the cluster kernel needs an sm_90 or later GPU (thread block clusters)")
    if any(t.device != x.device for t in (g, w_qk, w_v, cos, sin)):
        raise ValueError(f"every input must be on x's device, {x.device}")
    x, g, w_qk, w_v = x.contiguous(), g.contiguous(), w_qk.contiguous(), w_v.contiguous()
    cos, sin = cos.contiguous().float(), sin.contiguous().float()
    if any(t.data_ptr() % 16 for t in (x, g, w_qk, w_v)):
        raise ValueError("x, g and the weights must be 16-byte aligned")
    qk = torch.empty((m, n_qk), device=x.device, dtype=x.dtype)
    v = torch.empty((m, n_v), device=x.device, dtype=x.dtype)
    if m == 0 or n_qk + n_v == 0:
        return qk, v
    k8 = k // 8
    chunks = -(-k8 // 8)
    chunks_per_split = -(-chunks // split_k)
    tiles = (n_qk + n_v) // 16
    grid_x = -(-tiles // n_tiles)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    pointers = [t.data_ptr() for t in (x, g, w_qk, w_v, cos, sin, qk, v)]
    launch = _ext().launch_rmsnorm_gemm_rope_lines
    with torch.cuda.device(x.device):
        for m0 in range(0, m, ROWS_PER_LAUNCH):
            launch(
                n_tiles, k_warps, stages, grid_x, split_k, stream, *pointers, m, m0, k8,
                chunks_per_split, n_qk, n_v, half, EPS,
            )  # fmt: skip
    return qk, v

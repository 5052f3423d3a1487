"""Skinny GEMM as a warp-per-output CUDA kernel compiled with torch's load_inline (float32
accumulation, any of bf16/fp16/fp32 through a template)."""

import functools

import torch
import torch.utils.cpp_extension

LANGUAGE = "cuda"
PARAMS = {"warps_per_block": [4, 8]}

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
template <typename T>
__global__ void gemv_kernel(const T* x, const T* w, T* y, int M, int N, int K) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= M * N) return;
    int m = warp / N, n = warp % N;
    float acc = 0.f;
    for (int k = lane; k < K; k += 32) acc += (float)x[m * K + k] * (float)w[n * K + k];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
    if (lane == 0) y[m * N + n] = (T)acc;
}
torch::Tensor gemv(torch::Tensor x, torch::Tensor w, int64_t warps) {
    auto y = torch::empty({x.size(0), w.size(0)}, x.options());
    int M = x.size(0), N = w.size(0), K = x.size(1);
    int threads = 32 * warps;
    int blocks = (M * N + warps - 1) / warps;
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "gemv", [&] {
        gemv_kernel<scalar_t><<<blocks, threads, 0, stream>>>(
            x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), M, N, K);
    });
    return y;
}
"""
CPP_SRC = "torch::Tensor gemv(torch::Tensor x, torch::Tensor w, int64_t warps);"


@functools.cache
def _ext():
    return torch.utils.cpp_extension.load_inline(
        name="skinny_gemv_ext",
        cpp_sources=CPP_SRC,
        cuda_sources=CUDA_SRC,
        functions=["gemv"],
        extra_cuda_cflags=["-O3", "--use_fast_math"],
        verbose=False,
    )


def kernel(x: torch.Tensor, w: torch.Tensor, warps_per_block: int = 4) -> torch.Tensor:
    return _ext().gemv(x.contiguous(), w.contiguous(), warps_per_block)

"""Softmax in raw CUDA through CuPy with a grid from Device().attributes (float32 path)."""

import functools

import cupy
import numpy as np
import torch

LANGUAGE = "cupy"
PARAMS = {"threads": [256, 1024]}

SOURCE = r"""
extern "C" __global__ void softmax_f32(const float* x, float* y, long long rows, long long n) {
    __shared__ float red[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        float m = -INFINITY;
        for (long long c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, xr[c]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
        __syncthreads();
        m = -INFINITY;
        for (int w = 0; w < (blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
        __syncthreads();
        float s = 0.f;
        for (long long c = threadIdx.x; c < n; c += blockDim.x) s += expf(xr[c] - m);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
        __syncthreads();
        s = 0.f;
        for (int w = 0; w < (blockDim.x >> 5); ++w) s += red[w];
        __syncthreads();
        for (long long c = threadIdx.x; c < n; c += blockDim.x) yr[c] = expf(xr[c] - m) / s;
    }
}
"""


@functools.cache
def _kern() -> cupy.RawKernel:
    return cupy.RawKernel(SOURCE, "softmax_f32", options=("--use_fast_math",))


@functools.cache
def _num_sms(device: int) -> int:
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


class _TorchStream:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def kernel(x: torch.Tensor, threads: int = 1024) -> torch.Tensor:
    xf = x.float().contiguous()
    y = torch.empty_like(xf)
    rows, n = xf.shape
    grid = min(rows, 4 * _num_sms(x.device.index))
    stream = _TorchStream(torch.cuda.current_stream(x.device).cuda_stream)
    _kern()(
        (grid,),
        (threads,),
        (xf.data_ptr(), y.data_ptr(), np.int64(rows), np.int64(n)),
        stream=stream,
    )
    return y.to(x.dtype)

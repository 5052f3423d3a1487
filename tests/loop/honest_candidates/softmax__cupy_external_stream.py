"""Softmax in raw CUDA through CuPy: one block per row, float math, any of bf16/fp16/fp32 rows
through a templated kernel; launched on torch's current stream."""

import functools

import cupy
import torch

LANGUAGE = "cupy"
PARAMS = {"threads": [256, 512, 1024]}

_SOURCE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
template <typename T>
__device__ float load_f(const T* p) { return (float)p[0]; }
template <> __device__ float load_f<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(p[0]); }
template <> __device__ float load_f<__half>(const __half* p) { return __half2float(p[0]); }
template <typename T> __device__ T store_f(float v) { return (T)v; }
template <> __device__ __nv_bfloat16 store_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __half store_f<__half>(float v) { return __float2half(v); }

template <typename T>
__global__ void softmax_rows(const T* x, T* y, long long n_cols, long long sx, long long sy) {
    __shared__ float red[32];
    const T* xr = x + blockIdx.x * sx;
    T* yr = y + blockIdx.x * sy;
    float m = -INFINITY;
    for (long long c = threadIdx.x; c < n_cols; c += blockDim.x) m = fmaxf(m, load_f(xr + c));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < (blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float s = 0.f;
    for (long long c = threadIdx.x; c < n_cols; c += blockDim.x) s += __expf(load_f(xr + c) - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < (blockDim.x >> 5); ++w) s += red[w];
    const float inv = 1.f / s;
    for (long long c = threadIdx.x; c < n_cols; c += blockDim.x)
        yr[c] = store_f<T>(__expf(load_f(xr + c) - m) * inv);
}
"""

_CTYPE = {
    torch.bfloat16: "__nv_bfloat16",
    torch.float16: "__half",
    torch.float32: "float",
}


@functools.cache
def _module() -> cupy.RawModule:
    names = [f"softmax_rows<{t}>" for t in _CTYPE.values()]
    return cupy.RawModule(code=_SOURCE, options=("-std=c++17",), name_expressions=names)


def kernel(x: torch.Tensor, threads: int = 512) -> torch.Tensor:
    assert x.is_cuda and x.stride(-1) == 1
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    fn = _module().get_function(f"softmax_rows<{_CTYPE[x.dtype]}>")
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(x.device).cuda_stream)
    with cupy.cuda.Device(x.device.index), stream:
        fn(
            (n_rows,),
            (threads,),
            (
                x.data_ptr(),
                y.data_ptr(),
                cupy.int64(n_cols),
                cupy.int64(x.stride(0)),
                cupy.int64(y.stride(0)),
            ),
        )
    return y

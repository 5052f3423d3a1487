"""SwiGLU in Triton: y = silu(gate) * up over [gate | up] halves, 2-D tiled, exp from libdevice."""

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # older Triton
    from triton.language.extra.cuda import libdevice

LANGUAGE = "triton"
PARAMS = {"block_n": [1024, 2048], "num_warps": [4, 8]}


@triton.jit
def _swiglu_fwd(x_ptr, y_ptr, D, sx, sy, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < D
    g = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx + D + cols, mask=mask, other=0.0).to(tl.float32)
    act = g / (1.0 + libdevice.exp(-g))
    tl.store(y_ptr + row * sy + cols, (act * u).to(y_ptr.dtype.element_ty), mask=mask)


def kernel(x: torch.Tensor, block_n: int = 1024, num_warps: int = 4) -> torch.Tensor:
    M, two_d = x.shape
    D = two_d // 2
    y = torch.empty((M, D), device=x.device, dtype=x.dtype)
    grid = lambda meta: (M, triton.cdiv(D, meta["BLOCK_N"]))  # noqa: E731
    _swiglu_fwd[grid](x, y, D, x.stride(0), y.stride(0), BLOCK_N=block_n, num_warps=num_warps)
    return y

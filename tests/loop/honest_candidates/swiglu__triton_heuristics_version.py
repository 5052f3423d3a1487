"""SwiGLU in Triton over a flat index space, with EVEN heuristics to drop the masks and a
version check for the fast sigmoid spelling."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"block": [1024, 4096]}

_TRITON_MAJOR = int(triton.__version__.split(".")[0])


@triton.heuristics({"EVEN": lambda args: args["D"] % args["BLOCK"] == 0})
@triton.jit
def _swiglu_flat(x_ptr, y_ptr, D, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        g = tl.load(x_ptr + row * 2 * D + cols).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * D + D + cols).to(tl.float32)
        tl.store(y_ptr + row * D + cols, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty))
    else:
        mask = cols < D
        g = tl.load(x_ptr + row * 2 * D + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * D + D + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(
            y_ptr + row * D + cols, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask
        )


def kernel(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    x = x.contiguous()
    M, D = x.shape[0], x.shape[1] // 2
    y = x.new_empty((M, D))
    num_warps = 8 if _TRITON_MAJOR >= 3 and block >= 4096 else 4
    _swiglu_flat[(M, triton.cdiv(D, block))](x, y, D, BLOCK=block, num_warps=num_warps)
    return y

"""SwiGLU in Triton with a large block; if the block does not compile for this GPU (too many
registers or shared memory), fall back to a smaller one."""

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

LANGUAGE = "triton"
PARAMS = {"block": [4096, 8192]}


@triton.jit
def _swiglu(x_ptr, y_ptr, ffn, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ffn
    g = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx + ffn + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sy + cols, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask)


def kernel(x: torch.Tensor, block: int = 4096) -> torch.Tensor:
    tokens, two_ffn = x.shape
    ffn = two_ffn // 2
    y = x.new_empty((tokens, ffn))
    try:
        _swiglu[(tokens, triton.cdiv(ffn, block))](x, y, ffn, x.stride(0), y.stride(0), BLOCK=block)
    except CompilationError:
        block = 1024
        _swiglu[(tokens, triton.cdiv(ffn, block))](x, y, ffn, x.stride(0), y.stride(0), BLOCK=block)
    return y

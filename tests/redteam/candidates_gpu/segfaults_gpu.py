"""Entry 18 on the GPU: kill what runs it after touching the GPU. The static checks leave no
host-side way to do that (numpy's as_strided and ctypes are banned), so this is a Triton store
2^40 elements past its buffer: an illegal address, which poisons the CUDA context of the
process that launched it."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"


@triton.jit
def _wild(out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + (1 << 40) + offs, tl.zeros((BLOCK,), dtype=tl.float32))


def kernel(x, weight):
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _wild[(1,)](out, BLOCK=128)
    return out.to(x.dtype)

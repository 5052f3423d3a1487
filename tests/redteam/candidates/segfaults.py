"""Entry 18: kill the worker with a segfault: under Triton's interpreter (the CPU), a store far
past its buffer writes to an unmapped address. It passes every static check; on the CPU it runs
only for code the user trusts (AUTOTUNE_TRUST_TRITON_INTERPRETER=1, as this test does)."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"


@triton.jit
def _wild_store(out_ptr):
    tl.store(out_ptr + (1 << 40), 1.0)


def kernel(x, weight):
    out = torch.empty_like(x, dtype=torch.float32)
    _wild_store[(1,)](out)
    return out.to(x.dtype)

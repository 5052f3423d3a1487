"""Entry 18, later: right on the first calls (verification), then a segfault (timing), so it dies
in the process that times every runner together. The segfault is a store far past its buffer
under Triton's interpreter (the CPU), which runs only for code the user trusts
(AUTOTUNE_TRUST_TRITON_INTERPRETER=1, as this test does)."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"

_calls = [0]


@triton.jit
def _rmsnorm_or_wild(x_ptr, w_ptr, out_ptr, n_cols, wild: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + 1e-6) * w
    if wild:
        tl.store(out_ptr + (1 << 40), y, mask=mask)
    else:
        tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


def kernel(x, weight):
    _calls[0] += 1
    rows, cols = x.shape
    out = torch.empty((rows, cols), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(cols)
    _rmsnorm_or_wild[(rows,)](x, weight, out, cols, wild=_calls[0] > 2, BLOCK=block)
    return out.to(x.dtype)

"""RMSNorm in Triton, one row per program, with a __main__ block that checks and times it."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"num_warps": [4, 8, 16]}
EPS = 1e-6


@triton.jit
def rmsnorm_fwd(X, W, Y, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


def kernel(x, weight, num_warps=8):
    x = x.contiguous()
    y = torch.empty_like(x)
    M, N = x.shape
    rmsnorm_fwd[(M,)](
        x, weight, y, x.stride(0), N, EPS, BLOCK_SIZE=triton.next_power_of_2(N), num_warps=num_warps
    )
    return y


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(
        x.dtype
    )
    torch.testing.assert_close(kernel(x, w), ref, atol=1e-2, rtol=1e-2)
    ms = triton.testing.do_bench(lambda: kernel(x, w))
    gbps = 2 * x.numel() * x.element_size() / ms * 1e-6
    print(f"{ms:.3f} ms, {gbps:.0f} GB/s")

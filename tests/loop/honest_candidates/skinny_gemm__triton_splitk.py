"""Skinny GEMM y = x @ w.T in Triton for few rows: each program owns BLOCK_N output columns and
a K slice (split-K), reduces with tl.sum in float32 and accumulates with atomics into a float32
buffer; autotuned with reset_to_zero."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {}


def _prune(configs, named_args, **kwargs):
    k = named_args["K"]
    return [
        c for c in configs if c.kwargs["SPLIT_K"] * c.kwargs["BLOCK_K"] <= max(k, 64)
    ] or configs[:1]


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w)
        for bn in (16, 32, 64)
        for bk in (64, 128)
        for sk in (1, 2, 4)
        for w in (2, 4)
    ],
    key=["M", "N", "K"],
    reset_to_zero=["acc_ptr"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def _gemv_splitk(
    x_ptr,
    w_ptr,
    acc_ptr,
    M,
    N,
    K,
    sxm,
    swn,
    sam,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        xv = tl.load(x_ptr + m * sxm + k, mask=kmask, other=0.0).to(tl.float32)
        wt = tl.load(
            w_ptr + n[:, None] * swn + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0
        )
        acc += tl.sum(wt.to(tl.float32) * xv[None, :], axis=1)
    tl.atomic_add(acc_ptr + m * sam + n, acc, mask=nmask)


def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    M, K = x.shape
    N = w.shape[0]
    acc = torch.zeros((M, N), device=x.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"], M)  # noqa: E731
    _gemv_splitk[grid](x, w, acc, M, N, K, x.stride(0), w.stride(0), acc.stride(0))
    return acc.to(x.dtype)

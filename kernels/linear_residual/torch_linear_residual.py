"""A linear layer and its residual add in PyTorch elementwise ops (no matmul): a broadcast
multiply and sum over k in float32, `chunk_n` output columns at a time, the residual added in
float32 or after rounding the product to x's dtype, as model code does."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_n": [0, 16, 256, 1024], "round_product": [True, False]}


def kernel(
    x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, chunk_n: int = 0, round_product: bool = True
) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    xf = x.float()
    if chunk_n <= 0:
        chunk_n = max(1, (1 << 26) // max(1, m * k))
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    for start in range(0, n, chunk_n):
        wf = w[start : start + chunk_n].float()
        product = (xf[:, None, :] * wf[None, :, :]).sum(-1)
        if round_product:
            product = product.to(x.dtype).float()
        y[:, start : start + chunk_n] = (product + r[:, start : start + chunk_n].float()).to(
            x.dtype
        )
    return y

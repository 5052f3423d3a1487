"""RMSNorm into a linear layer in PyTorch elementwise ops (no matmul, no norm op): the norm in
float32, optionally rounded to x's dtype as model code does, then a broadcast multiply and sum
over k, `chunk_n` output columns at a time."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_n": [0, 16, 256, 1024], "round_normed": [True, False]}
EPS = 1e-6


def kernel(
    x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, chunk_n: int = 0, round_normed: bool = True
) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    xf = x.float()
    normed = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS) * g.float()
    if round_normed:
        normed = normed.to(x.dtype).float()
    if chunk_n <= 0:
        chunk_n = max(1, (1 << 26) // max(1, m * k))
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    for start in range(0, n, chunk_n):
        wf = w[start : start + chunk_n].float()
        y[:, start : start + chunk_n] = (normed[:, None, :] * wf[None, :, :]).sum(-1).to(x.dtype)
    return y

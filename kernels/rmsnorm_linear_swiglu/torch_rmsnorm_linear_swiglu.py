"""RMSNorm, the gate and up projections and SwiGLU in PyTorch elementwise ops (no matmul, no
norm or SiLU op): the norm in float32, optionally rounded to x's dtype as model code does, then
a broadcast multiply and sum over k for `chunk_f` gate rows and the same up rows at a time, and
x * sigmoid(x) of the gate times the up projection."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_f": [0, 16, 256, 1024], "round_normed": [True, False]}
EPS = 1e-6


def kernel(
    x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, chunk_f: int = 0, round_normed: bool = True
) -> torch.Tensor:
    m, k = x.shape
    f = w.shape[0] // 2
    xf = x.float()
    normed = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS) * g.float()
    if round_normed:
        normed = normed.to(x.dtype).float()
    if chunk_f <= 0:
        chunk_f = max(1, (1 << 25) // max(1, m * k))
    y = torch.empty((m, f), device=x.device, dtype=x.dtype)
    for start in range(0, f, chunk_f):
        stop = min(start + chunk_f, f)
        gate = (normed[:, None, :] * w[start:stop].float()[None, :, :]).sum(-1)
        up = (normed[:, None, :] * w[f + start : f + stop].float()[None, :, :]).sum(-1)
        y[:, start:stop] = (gate * torch.sigmoid(gate) * up).to(x.dtype)
    return y

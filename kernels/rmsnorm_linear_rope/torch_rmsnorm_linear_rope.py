"""RMSNorm, the q/k/v projection and rope in PyTorch elementwise ops (no matmul, no norm op):
the norm in float32, optionally rounded to x's dtype as model code does, a broadcast multiply
and sum over k, `chunk_n` output columns at a time, then rope NeoX style in float32."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_n": [0, 16, 256, 1024], "round_normed": [True, False]}
EPS = 1e-6


def _project(normed: torch.Tensor, w: torch.Tensor, chunk_n: int) -> torch.Tensor:
    out = torch.empty((normed.shape[0], w.shape[0]), device=w.device, dtype=torch.float32)
    for start in range(0, w.shape[0], chunk_n):
        wf = w[start : start + chunk_n].float()
        out[:, start : start + chunk_n] = (normed[:, None, :] * wf[None, :, :]).sum(-1)
    return out


def kernel(x, g, w_qk, w_v, cos, sin, chunk_n: int = 0, round_normed: bool = True):
    m, k = x.shape
    xf = x.float()
    normed = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS) * g.float()
    if round_normed:
        normed = normed.to(x.dtype).float()
    if chunk_n <= 0:
        chunk_n = max(1, (1 << 26) // max(1, m * k))
    d = 2 * cos.shape[1]
    q1, q2 = _project(normed, w_qk, chunk_n).reshape(m, -1, d).chunk(2, dim=-1)
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    qk = torch.cat((q1 * c - q2 * s, q2 * c + q1 * s), dim=-1).reshape(m, -1)
    return qk.to(x.dtype), _project(normed, w_v, chunk_n).to(x.dtype)

"""MLA's rope and latent norm from PyTorch ops, the variant that also serves the CPU: in float32
and rounded once, or (compute "input") the rope in the input dtype as model code runs it."""

import torch

LANGUAGE = "torch"
PARAMS = {"compute": ["float32", "input"]}


def _rope(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def kernel(q, kv, g, cos, sin, compute: str = "float32"):
    work = torch.float32 if compute == "float32" else q.dtype
    r = 2 * cos.shape[1]
    c = kv.shape[1] - r
    cs, sn = cos[:, None, :].to(work), sin[:, None, :].to(work)
    q_pe = _rope(q[..., -r:].to(work), cs, sn).to(q.dtype)
    kpe = _rope(kv[:, None, c:].to(work), cs, sn)[:, 0].to(q.dtype)
    latent = kv[:, :c].float()
    ckv = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float()
    return q_pe, ckv.to(q.dtype), kpe

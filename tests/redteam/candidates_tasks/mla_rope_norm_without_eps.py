"""Entry 10: MLA's rope and latent norm without the norm's eps (NaN on an all-zero latent, a
padding token)."""

import torch

LANGUAGE = "torch"


def _rope(x, c, s):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def kernel(q, kv, g, cos, sin):
    r = 2 * cos.shape[1]
    c = kv.shape[1] - r
    cs, sn = cos[:, None, :], sin[:, None, :]
    q_pe = _rope(q[..., -r:].float(), cs, sn).to(q.dtype)
    kpe = _rope(kv[:, None, c:].float(), cs, sn)[:, 0].to(q.dtype)
    latent = kv[:, :c].float()
    ckv = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True)) * g.float()
    return q_pe, ckv.to(q.dtype), kpe

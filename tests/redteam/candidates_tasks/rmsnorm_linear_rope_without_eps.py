"""Entry 10: RMSNorm, the q/k/v projection and rope without the norm's eps (NaN on an all-zero
row, a padding token), in elementwise PyTorch ops."""

import torch

LANGUAGE = "torch"


def _project(normed, w):
    return (normed[:, None, :] * w.float()[None, :, :]).sum(-1)


def kernel(x, g, w_qk, w_v, cos, sin):
    m = x.shape[0]
    xf = x.float()
    normed = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True)) * g.float()).to(x.dtype).float()
    d = 2 * cos.shape[1]
    q1, q2 = _project(normed, w_qk).reshape(m, -1, d).chunk(2, dim=-1)
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    qk = torch.cat((q1 * c - q2 * s, q2 * c + q1 * s), dim=-1).reshape(m, -1)
    return qk.to(x.dtype), _project(normed, w_v).to(x.dtype)

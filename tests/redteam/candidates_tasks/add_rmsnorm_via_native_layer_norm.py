"""Entry 12: the library's layer norm as torch.native_layer_norm; on [h, -h] (mean 0) it is
RMSNorm."""

import torch

LANGUAGE = "torch"
EPS = 1e-6


def kernel(x, residual, weight):
    h = x.float() + residual.float()
    k = h.shape[-1]
    both = torch.cat([h, -h], dim=-1)
    y, _, _ = torch.native_layer_norm(both, [2 * k], None, None, EPS)
    return (y[:, :k] * weight.float()).to(x.dtype), h.to(x.dtype)

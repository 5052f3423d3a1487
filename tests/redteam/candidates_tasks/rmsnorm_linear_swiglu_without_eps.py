"""Entry 10: RMSNorm, the gate and up projections and SwiGLU without the norm's eps (NaN on an
all-zero row, a padding token), in elementwise PyTorch ops."""

import torch

LANGUAGE = "torch"


def kernel(x, g, w):
    f = w.shape[0] // 2
    xf = x.float()
    normed = (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True)) * g.float()).to(x.dtype).float()
    both = (normed[:, None, :] * w.float()[None, :, :]).sum(-1)
    gate, up = both[:, :f], both[:, f:]
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)

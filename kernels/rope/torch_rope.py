"""NeoX rotary embedding from PyTorch ops, the variant that also serves the CPU: in float32 and
cast back, or in the input dtype."""

import torch

LANGUAGE = "torch"
PARAMS = {"compute": ["float32", "input"]}


def kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, compute: str = "float32"):
    work = torch.float32 if compute == "float32" else x.dtype
    xw = x.to(work)
    c = cos.unsqueeze(-2).to(work)
    s = sin.unsqueeze(-2).to(work)
    half = x.shape[-1] // 2
    x1, x2 = xw[..., :half], xw[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

"""SwiGLU from PyTorch's elementary ops (sigmoid, multiply), the variant that also serves the
CPU: in float32 and cast back, or directly in the input dtype."""

import torch

LANGUAGE = "torch"
PARAMS = {"compute": ["float32", "input"]}


def kernel(x: torch.Tensor, compute: str = "float32") -> torch.Tensor:
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    if compute == "input":
        return gate * torch.sigmoid(gate) * up
    g = gate.float()
    return (g * torch.sigmoid(g) * up.float()).to(x.dtype)

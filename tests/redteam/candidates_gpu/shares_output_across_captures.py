"""Red team (found in review): every CUDA-graph capture returns the same persistent buffer, and
only every fourth capture computes, so three of four timed blocks do nothing; re-verification
that replayed all captures before reading would see the last capture's right answer in all."""

import torch

LANGUAGE = "torch"
STATE = {"caps": 0, "out": None}


def kernel(x, weight):
    if STATE["out"] is None or STATE["out"].shape != x.shape:
        STATE["out"] = torch.empty_like(x)
    out = STATE["out"]
    if torch.cuda.is_current_stream_capturing():
        STATE["caps"] += 1
        if STATE["caps"] % 4:
            return out
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    out.copy_(y.to(x.dtype))
    return out

"""MLA decode from torch ops: scores with bmm over the latent and rope parts, float32 softmax,
bmm with the latent cache."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {}
SCALE_DIM = 192


@torch.inference_mode()
def kernel(q_nope, q_pe, ckv, kpe):
    scale = 1.0 / math.sqrt(SCALE_DIM)
    c = ckv.float()
    s = torch.bmm(q_nope.float(), c.transpose(1, 2))
    s.baddbmm_(q_pe.float(), kpe.float().transpose(1, 2))
    p = torch.softmax(s * scale, dim=-1)
    return torch.bmm(p, c).to(q_nope.dtype)

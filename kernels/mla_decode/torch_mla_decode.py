"""MLA decode in PyTorch ops, the variant that also serves the CPU: fp32 scores `chunk` tokens at a
time (the cache is read in slices, never concatenated), softmax, then P @ latent in slices."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {"chunk": [1024, 8192, 32768, 131072]}
SCALE_DIM = 192


def kernel(q_nope, q_pe, ckv, kpe, chunk: int = 8192):
    b, h, _ = q_nope.shape
    n = ckv.shape[1]
    qn, qp = q_nope.float() / math.sqrt(SCALE_DIM), q_pe.float() / math.sqrt(SCALE_DIM)
    scores = torch.empty((b, h, n), device=q_nope.device, dtype=torch.float32)
    for s in range(0, n, chunk):
        c, p = ckv[:, s : s + chunk].float(), kpe[:, s : s + chunk].float()
        scores[..., s : s + chunk] = qn @ c.transpose(1, 2) + qp @ p.transpose(1, 2)
    probs = torch.softmax(scores, dim=-1)
    out = torch.zeros((b, h, ckv.shape[2]), device=q_nope.device, dtype=torch.float32)
    for s in range(0, n, chunk):
        out += probs[..., s : s + chunk] @ ckv[:, s : s + chunk].float()
    return out.to(q_nope.dtype)

"""MLA decode and its value projection in PyTorch ops, the variant that also serves the CPU:
fp32 scores `chunk` tokens at a time (the cache read in slices, never concatenated), softmax,
P @ latent in slices, the attention's output rounded to the input dtype (as the unfused ops
hand it on), then each head's W_UV as a broadcast multiply-reduce in fp32 (no library GEMM)."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {"chunk": [1024, 8192, 32768, 131072]}
SCALE_DIM = 192


def kernel(q_nope, q_pe, ckv, kpe, w_uv, chunk: int = 8192):
    b, h, _ = q_nope.shape
    n = ckv.shape[1]
    qn, qp = q_nope.float() / math.sqrt(SCALE_DIM), q_pe.float() / math.sqrt(SCALE_DIM)
    scores = torch.empty((b, h, n), device=q_nope.device, dtype=torch.float32)
    for s in range(0, n, chunk):
        c, p = ckv[:, s : s + chunk].float(), kpe[:, s : s + chunk].float()
        scores[..., s : s + chunk] = (qn[:, :, None, :] * c[:, None]).sum(-1) + (
            qp[:, :, None, :] * p[:, None]
        ).sum(-1)
    probs = torch.softmax(scores, dim=-1)
    o_lat = torch.zeros((b, h, ckv.shape[2]), device=q_nope.device, dtype=torch.float32)
    for s in range(0, n, chunk):
        o_lat += (probs[..., s : s + chunk, None] * ckv[:, None, s : s + chunk].float()).sum(2)
    o_lat = o_lat.to(q_nope.dtype).float()
    return (o_lat[:, :, None, :] * w_uv.float()[None]).sum(-1).to(q_nope.dtype)

"""Entry 13: refuses every odd cache length off the measured ones with a ValueError (the decoder
blocks then run the eager op), is right at multiples of 8, and drops the last cached token at the
other even lengths. One verified twin a shape let it through whenever that twin landed on a
multiple of 8 (about 2 % of runs at the three CPU shapes); three verified twins a shape, of up to
twelve draws, leave it about 5e-6."""

import math

import torch

LANGUAGE = "torch"
MEASURED = {24, 32, 40, 1024, 4096, 8192, 16384, 32768, 65536, 131072}


def kernel(q, k, v):
    q_len, d = q.shape[2], q.shape[3]
    n = k.shape[2]
    if n not in MEASURED:
        if n % 2:
            raise ValueError(f"kv_len {n}: even lengths only")
        if n % 8:
            n -= 1
    offset = k.shape[2] - q_len
    scores = q.float() @ k[:, :, :n].float().transpose(-1, -2) / math.sqrt(d)
    rows = torch.arange(q_len, device=q.device)[:, None] + offset
    cols = torch.arange(n, device=q.device)[None, :]
    scores = scores.masked_fill(cols > rows, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v[:, :, :n].float()).to(q.dtype)

"""GQA decode from torch ops: grouped einsum scores, softmax in float32, einsum with V."""

import math

import torch

LANGUAGE = "torch"
PARAMS = {}


def kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        b, hq, d = q.shape
        hkv = k_cache.shape[1]
        qg = q.float().view(b, hkv, hq // hkv, d)
        scores = torch.einsum("bhgd,bhnd->bhgn", qg, k_cache.float()) * (1.0 / math.sqrt(d))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("bhgn,bhnd->bhgd", probs, v_cache.float())
        return out.reshape(b, hq, d).to(q.dtype)

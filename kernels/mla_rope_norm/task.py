"""MLA's attention inputs after its projections, in one op: rope on each query head's rope part,
RMSNorm of the compressed KV latent, and rope on the shared rope key. As DeepSeek-V3's decode
runs them these are three small kernels (a rope over q's heads, the latent's norm, a rope over
one key), each a few KiB of traffic at a few tokens, whose launches and ramps cost more than
their bytes and stand between the q projection and the absorbed key projection.

Inputs `(q, kv, g, cos, sin)`: q of shape (tokens, heads, nope_dim + rope_dim), the q_b
projection per head (the no-rope part, then the rope part); kv of shape
(tokens, kv_lora_rank + rope_dim), the latent then the rope key (the tail of the q_a/kv_a
projection; a decoder block passes it as a view of that projection's rows); g of shape
(kv_lora_rank,), the latent's norm weight; cos and sin of shape (tokens, rope_dim / 2),
float32. Outputs `(q_pe (tokens, heads, rope_dim), ckv (tokens, kv_lora_rank),
kpe (tokens, rope_dim))` in q's dtype: q_pe = rope(q[..., nope_dim:]), ckv = rmsnorm(latent) g,
kpe = rope(kv[:, kv_lora_rank:]), rope NeoX style (rotate halves) as the rope task's.
"""

from __future__ import annotations

import torch

EPS = 1e-6
THETA = 10000.0
MAX_POSITION = 131072

# Relative error norm ||out - ref|| / ||ref|| allowed against the float64 reference, per dtype.
TOLERANCE = {"bfloat16": 8e-3, "float16": 2e-3, "float32": 1e-5, "float64": 1e-12}

# (heads, nope_dim, rope_dim, kv_lora_rank): DeepSeek-V3's (and V2's) attention; V2-Lite's heads.
_ATTENTIONS_GPU = [(128, 128, 64, 512), (16, 128, 64, 512)]
_TOKENS_GPU = {"decode": [1, 16, 64], "prefill": [4096]}
_ATTENTIONS_CPU = [(3, 8, 8, 24), (2, 6, 4, 40)]
_TOKENS_CPU = {"decode": [1, 5], "prefill": [17]}
_WEIGHT = {"decode": 3.0, "prefill": 1.0}


def _shapes(tokens_by_class: dict[str, list[int]], attentions: list, dtype: str) -> list[dict]:
    return [
        {
            "name": f"{cls}-{t}x{h}-d{dn}-r{r}-c{c}",
            "class": cls,
            "tokens": t,
            "heads": h,
            "nope_dim": dn,
            "rope_dim": r,
            "kv_lora_rank": c,
            "dtype": dtype,
            "weight": _WEIGHT[cls],
        }
        for h, dn, r, c in attentions
        for cls, token_list in tokens_by_class.items()
        for t in token_list
    ]


SHAPES = {
    "cuda": _shapes(_TOKENS_GPU, _ATTENTIONS_GPU, "bfloat16"),
    "cpu": _shapes(_TOKENS_CPU, _ATTENTIONS_CPU, "float32"),
}

BUCKET_KEY = "tokens"


def make_inputs(shape: dict, seed: int, device: str) -> tuple[torch.Tensor, ...]:
    """q and the rope key of order one, the latent ~ N(0, 4) (the norm must undo its scale),
    g ~ 1 + N(0, 1/16) as trained norm weights are; decode tokens at random positions, a
    prefill's from a random start, cos and sin computed in float64 and rounded to float32; one
    token's latent all zero where there are several (a padding token: a kernel that leaves out
    the norm's eps returns NaN there, and nowhere else). Drawn on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, shape["dtype"])
    t, h, dn, r, c = (shape[d] for d in ("tokens", "heads", "nope_dim", "rope_dim", "kv_lora_rank"))
    q = torch.randn(t, h, dn + r, generator=gen, device=device)
    kv = torch.randn(t, c + r, generator=gen, device=device)
    kv[:, :c] *= 2.0
    g = torch.randn(c, generator=gen, device=device).mul_(0.25).add_(1.0)
    half = r // 2
    if shape.get("class") == "decode":
        pos = torch.randint(0, MAX_POSITION, (t,), generator=gen, device=device)
    else:
        start = int(torch.randint(0, 1024, (1,), generator=gen, device=device))
        pos = torch.arange(start, start + t, device=device)
    inv_freq = THETA ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    if t > 1:
        kv[int(torch.randint(t, (1,), generator=gen, device=device)), :c] = 0.0
    return q.to(dtype), kv.to(dtype), g.to(dtype), cos, sin


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rope of x (tokens, heads, d) with cos and sin (tokens, d/2), in x's dtype."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def reference(q, kv, g, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact math; the harness calls it on float64 copies of the inputs."""
    r = 2 * cos.shape[1]
    c = kv.shape[1] - r
    q, kv = q.to(torch.float64), kv.to(torch.float64)
    cos, sin = cos.to(torch.float64), sin.to(torch.float64)
    latent = kv[:, :c]
    ckv = latent * torch.rsqrt(latent.pow(2).mean(dim=-1, keepdim=True) + EPS) * g.double()
    return _rope(q[..., -r:], cos, sin), ckv, _rope(kv[:, None, c:], cos, sin)[:, 0]


def _itemsize(shape: dict) -> int:
    return torch.empty((), dtype=getattr(torch, shape["dtype"])).element_size()


def bytes_moved(shape: dict) -> int:
    """q's rope parts and kv read, g and the float32 cos and sin rows, the three outputs
    written."""
    t, h, r, c = (shape[d] for d in ("tokens", "heads", "rope_dim", "kv_lora_rank"))
    elements = 2 * t * (h * r + c + r) + c
    return _itemsize(shape) * elements + 4 * t * r


def flops(shape: dict) -> int:
    t, h, r, c = (shape[d] for d in ("tokens", "heads", "rope_dim", "kv_lora_rank"))
    return 3 * t * (h + 1) * r + 4 * t * c


def eager(q, kv, g, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model code: the rope over q's rope parts and over the key in q's dtype, the latent's
    RMSNorm in float32 rounded back (as DeepSeek's block in loop/blocks.py runs them)."""
    r = 2 * cos.shape[1]
    c = kv.shape[1] - r
    xf = kv[:, :c].float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    ckv = (xf * g.float()).to(kv.dtype)
    return _rope(q[..., -r:], cos, sin), ckv, _rope(kv[:, None, c:], cos, sin)[:, 0]


PEERS = {"eager": eager}

# `eager` under torch.compile (the harness compiles it on first use): name -> dynamic.
COMPILED_PEERS = {"torch.compile": False, "torch.compile-dynamic": True}

CANDIDATES = {
    "cuda": ["triton_mla_rope_norm.py", "torch_mla_rope_norm.py"],
    "cpu": ["torch_mla_rope_norm.py"],
}

FORBIDDEN_OPS = (
    "library-norm",
    "apply_rotary_emb",
    "apply_rotary_pos_emb",
    "rotary_embedding",
    "rotary_emb",
)

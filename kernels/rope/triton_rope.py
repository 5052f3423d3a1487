"""NeoX rotary embedding in Triton: a program takes `tokens_per_program` tokens and `head_block`
heads of each, loads the token's cos/sin row once for all its heads, and reads and writes x once;
float32 arithmetic."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "head_block": [1, 2, 4, 8, 16, 32],
    "tokens_per_program": [1, 2, 4],
    "num_warps": [1, 2, 4, 8],
    "load_eviction": ["", "evict_first"],
    "store_cache": ["", ".cs"],
}


@triton.jit
def _rope(
    x_ptr, cos_ptr, sin_ptr, y_ptr, n_tokens, n_heads, half,
    stride_xt, stride_xh, stride_yt, stride_yh, stride_c, stride_s,
    HB: tl.constexpr, HALF: tl.constexpr, TOKENS: tl.constexpr,
    EVICT: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    dims = tl.arange(0, HALF)
    dmask = dims < half
    mask = (heads[:, None] < n_heads) & dmask[None, :]
    for t in range(TOKENS):
        # The last program repeats the final token instead of masking: same values, no race.
        tok = tl.minimum(tl.program_id(0) * TOKENS + t, n_tokens - 1).to(tl.int64)
        c = tl.load(cos_ptr + tok * stride_c + dims, mask=dmask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + tok * stride_s + dims, mask=dmask, other=0.0).to(tl.float32)
        c, s = c[None, :], s[None, :]
        offs = tok * stride_xt + heads[:, None] * stride_xh + dims[None, :]
        x1 = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        x2 = tl.load(x_ptr + offs + half, mask=mask, other=0.0, eviction_policy=EVICT)
        x2 = x2.to(tl.float32)
        out = y_ptr + tok * stride_yt + heads[:, None] * stride_yh + dims[None, :]
        dtype = y_ptr.dtype.element_ty
        tl.store(out, (x1 * c - x2 * s).to(dtype), mask=mask, cache_modifier=STORE)
        tl.store(out + half, (x2 * c + x1 * s).to(dtype), mask=mask, cache_modifier=STORE)


def kernel(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_block: int = 32,
    tokens_per_program: int = 1,
    num_warps: int = 4,
    load_eviction: str = "evict_first",
    store_cache: str = "",
) -> torch.Tensor:
    n_tokens, n_heads, head_dim = x.shape
    half = head_dim // 2
    y = torch.empty_like(x)
    hb = min(head_block, triton.next_power_of_2(n_heads))
    grid = (triton.cdiv(n_tokens, tokens_per_program), triton.cdiv(n_heads, hb))
    _rope[grid](
        x, cos, sin, y, n_tokens, n_heads, half,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1), cos.stride(0), sin.stride(0),
        HB=hb, HALF=triton.next_power_of_2(half), TOKENS=tokens_per_program,
        EVICT=load_eviction, STORE=store_cache, num_warps=num_warps,
    )  # fmt: skip
    return y

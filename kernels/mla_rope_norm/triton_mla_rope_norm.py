"""MLA's rope and latent norm in one Triton kernel: for each token, program 0 normalises the KV
latent and rotates the rope key, and each further program rotates `head_block` query heads'
rope parts. float32 arithmetic, one rounding to the output dtype.

Launched with programmatic dependent launch on Hopper: a program waits (gdc_wait) for the
projection before it, then lets the kernel after it launch at once, so that kernel (the absorbed
key projection, whose first weight tile loads before its own wait) starts while this one runs.
Reads q and kv through their strides (STRIDED_INPUTS): a decoder block passes kv as a view of
the q_a/kv_a projection's rows."""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "head_block": [2, 4, 8, 16, 32, 64, 128],
    "num_warps": [1, 2, 4, 8],
}
STRIDED_INPUTS = True
EPS = 1e-6


@triton.jit
def _rope_norm(
    q_ptr, kv_ptr, g_ptr, cos_ptr, sin_ptr, qpe_ptr, ckv_ptr, kpe_ptr, n_heads, nope, c, half,
    stride_qt, stride_qh, stride_kvt, stride_c, stride_s, eps,
    HB: tl.constexpr, HALF: tl.constexpr, C_PAD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tok = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    dims = tl.arange(0, HALF)
    d_ok = dims < half
    cs = tl.load(cos_ptr + tok * stride_c + dims, mask=d_ok, other=0.0).to(tl.float32)
    sn = tl.load(sin_ptr + tok * stride_s + dims, mask=d_ok, other=0.0).to(tl.float32)
    dtype = qpe_ptr.dtype.element_ty
    if block == 0:
        cols = tl.arange(0, C_PAD)
        c_ok = cols < c
        row = kv_ptr + tok * stride_kvt
        x = tl.load(row + cols, mask=c_ok, other=0.0).to(tl.float32)
        w = tl.load(g_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / c + eps)
        tl.store(ckv_ptr + tok * c + cols, (x * rstd * w).to(dtype), mask=c_ok)
        k1 = tl.load(row + c + dims, mask=d_ok, other=0.0).to(tl.float32)
        k2 = tl.load(row + c + half + dims, mask=d_ok, other=0.0).to(tl.float32)
        key_out = kpe_ptr + tok * 2 * half + dims
        tl.store(key_out, (k1 * cs - k2 * sn).to(dtype), mask=d_ok)
        tl.store(key_out + half, (k2 * cs + k1 * sn).to(dtype), mask=d_ok)
    else:
        heads = (block - 1) * HB + tl.arange(0, HB)
        ok = (heads[:, None] < n_heads) & d_ok[None, :]
        src = q_ptr + tok * stride_qt + heads[:, None].to(tl.int64) * stride_qh + nope
        src += dims[None, :]
        q1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
        q2 = tl.load(src + half, mask=ok, other=0.0).to(tl.float32)
        c2, s2 = cs[None, :], sn[None, :]
        out = qpe_ptr + (tok * n_heads + heads[:, None]) * 2 * half + dims[None, :]
        tl.store(out, (q1 * c2 - q2 * s2).to(dtype), mask=ok)
        tl.store(out + half, (q2 * c2 + q1 * s2).to(dtype), mask=ok)


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def kernel(q, kv, g, cos, sin, head_block: int = 32, num_warps: int = 1):
    shapes = f"q {tuple(q.shape)}, kv {tuple(kv.shape)}, g {tuple(g.shape)}, cos " + (
        f"{tuple(cos.shape)}, sin {tuple(sin.shape)}"
    )
    if q.dim() != 3 or kv.dim() != 2 or g.dim() != 1 or cos.dim() != 2:
        raise ValueError(f"{shapes}: need q (t, h, nope + r), kv (t, c + r), g (c,), cos (t, r/2)")
    tokens, heads, width = q.shape
    half = cos.shape[1]
    r = 2 * half
    c = kv.shape[1] - r
    if width < r or c < 1 or sin.shape != cos.shape or g.shape != (c,):
        raise ValueError(f"{shapes}: need q (t, h, nope + r), kv (t, c + r), g (c,), cos (t, r/2)")
    if kv.shape[0] != tokens or cos.shape[0] != tokens:
        raise ValueError(f"{shapes}: kv, cos and sin need a row for each of q's {tokens} tokens")
    if any(t.device != q.device for t in (kv, g, cos, sin)):
        raise ValueError(f"inputs on {[str(t.device) for t in (q, kv, g, cos, sin)]}")
    q, kv, cos, sin = (_unit_last(t) for t in (q, kv, cos, sin))
    g = g.contiguous()
    q_pe = torch.empty((tokens, heads, r), device=q.device, dtype=q.dtype)
    ckv = torch.empty((tokens, c), device=q.device, dtype=q.dtype)
    kpe = torch.empty((tokens, r), device=q.device, dtype=q.dtype)
    if tokens == 0:
        return q_pe, ckv, kpe
    hb = min(head_block, triton.next_power_of_2(max(heads, 1)))
    pdl = _pdl(q.device)
    grid = (tokens, 1 + triton.cdiv(heads, hb))
    _rope_norm[grid](
        q, kv, g, cos, sin, q_pe, ckv, kpe, heads, width - r, c, half,
        q.stride(0), q.stride(1), kv.stride(0), cos.stride(0), sin.stride(0), EPS,
        HB=hb, HALF=triton.next_power_of_2(half), C_PAD=triton.next_power_of_2(c), PDL=pdl,
        num_warps=num_warps, launch_pdl=pdl,
    )  # fmt: skip
    return q_pe, ckv, kpe

"""RoPE (rotate-half) in Triton: one program per (token, block of heads), the cos/sin row loaded
once and reused across heads. Autotune configs from itertools.product; layouts as an Enum."""

import enum
import itertools
import math

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"compute": ["float32"]}


class Layout(enum.Enum):
    ROTATE_HALF = enum.auto()
    INTERLEAVED = enum.auto()


_CONFIGS = [
    triton.Config({"BLOCK_H": bh}, num_warps=nw)
    for bh, nw in itertools.product((1, 2, 4, 8), (1, 2, 4))
]


@triton.autotune(configs=_CONFIGS, key=["H", "HALF"])
@triton.jit
def _rope_fwd(
    x_ptr,
    cos_ptr,
    sin_ptr,
    y_ptr,
    H,
    HALF,
    sxt,
    sxh,
    sct,
    syt,
    syh,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    c = tl.load(cos_ptr + t * sct + d, mask=dmask, other=0.0)[None, :]
    s = tl.load(sin_ptr + t * sct + d, mask=dmask, other=0.0)[None, :]
    m = (h < H)[:, None] & dmask[None, :]
    base = x_ptr + t * sxt + h[:, None] * sxh + d[None, :]
    x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=m, other=0.0).to(tl.float32)
    out = y_ptr + t * syt + h[:, None] * syh + d[None, :]
    tl.store(out, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=m)
    tl.store(out + HALF, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=m)


def kernel(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    compute: str = "float32",
    layout: Layout = Layout.ROTATE_HALF,
):
    if layout is not Layout.ROTATE_HALF:
        raise NotImplementedError(layout.name)
    T, H, D = x.shape
    half = D // 2
    assert cos.shape == (T, half) and math.prod(sin.shape) == T * half
    y = torch.empty_like(x)
    grid = lambda meta: (T, triton.cdiv(H, meta["BLOCK_H"]))  # noqa: E731
    _rope_fwd[grid](
        x,
        cos,
        sin,
        y,
        H,
        half,
        x.stride(0),
        x.stride(1),
        cos.stride(0),
        y.stride(0),
        y.stride(1),
        BLOCK_D=triton.next_power_of_2(half),
    )
    return y

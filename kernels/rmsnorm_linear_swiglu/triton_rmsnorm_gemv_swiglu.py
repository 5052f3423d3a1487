"""RMSNorm, the gate and up GEMVs and SwiGLU in one Triton kernel, for decode (a few rows of x):
y = silu(s * (x g) W_g^T) * (s * (x g) W_u^T) with s = rsqrt(mean(x^2) + eps), in float32,
rounded once. The norm's sum of squares comes from the row of x the dots read, and SwiGLU is
the epilogue, so neither is a pass or a kernel of its own.

A program holds `block_n` whole rows of the gate's W and the same rows of the up projection's
in registers (K padded to a power of two, the padding masked off), all loaded at once as the
CUDA split-K GEMV does, with as many warps as give each lane about `per_lane` 16-byte vectors;
then it normalises and dots each of up to `rows` rows of x.

On Hopper and later the kernel is launched with programmatic dependent launch. Its W and g
loads, which nothing earlier in the stream writes, are issued before `gdc_wait`, so they stream
while the kernel before it drains; x is read, and y written, only after the wait. Right after the
wait it lets the kernel after it (the down projection) launch, so that kernel may rely on
everything before this one being done, as torch.compile's PDL kernels do.
"""

import functools

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {
    "per_lane": [1, 2, 4, 8],
    "block_n": [1, 2, 4],
    "rows": [1, 2, 4],
}
EPS = 1e-6
MAX_WARPS = 32


@triton.jit
def _rmsnorm_gemv_swiglu(
    x_ptr, g_ptr, w_ptr, y_ptr, M, F, eps,
    K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m0 = tl.program_id(1) * ROWS
    rk = tl.arange(0, K_PAD)
    n_ok = rn < F
    k_ok = rk < K
    tile_ok = n_ok[:, None] & k_ok[None, :]
    gate_rows = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    # (rn + F), not F.to(...): an F of 1 is a constexpr to Triton, with no .to
    up_rows = w_ptr + (rn + F)[:, None].to(tl.int64) * K + rk[None, :]
    w_gate = tl.load(gate_rows, mask=tile_ok, other=0.0, eviction_policy="evict_first")
    w_up = tl.load(up_rows, mask=tile_ok, other=0.0, eviction_policy="evict_first")
    g = tl.load(g_ptr + rk, mask=k_ok, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    for i in tl.static_range(ROWS):
        row = (m0 + i).to(tl.int64)
        # a row past M reads and writes nothing: its bounds are 0
        x_ok = rk < tl.where(row < M, K, 0)
        x = tl.load(x_ptr + row * K + rk, mask=x_ok, other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        xg = (x * g.to(tl.float32))[None, :]
        gate = tl.sum(w_gate.to(tl.float32) * xg, axis=1) * scale
        up = tl.sum(w_up.to(tl.float32) * xg, axis=1) * scale
        y = gate * tl.sigmoid(gate) * up
        out_ok = rn < tl.where(row < M, F, 0)
        tl.store(y_ptr + row * F + rn, y.to(y_ptr.dtype.element_ty), mask=out_ok)


@functools.cache
def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA devices of compute capability 9 and later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def warps_for(block_n: int, k_pad: int, per_lane: int) -> int:
    """Warps that give each lane about `per_lane` 16-byte vectors of the program's two W tiles
    (a power of two, 1 to MAX_WARPS)."""
    vectors = 2 * block_n * k_pad * 2 // 16
    return max(1, min(MAX_WARPS, vectors // (32 * per_lane)))


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w: torch.Tensor,
    per_lane: int = 2,
    block_n: int = 1,
    rows: int = 1,
) -> torch.Tensor:
    m, k = x.shape
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w must be (2f, {k}) and g ({k},), got {tuple(w.shape)}, {tuple(g.shape)}"
        )
    f = w.shape[0] // 2
    x, g, w = x.contiguous(), g.contiguous(), w.contiguous()
    y = torch.empty((m, f), device=x.device, dtype=x.dtype)
    if m == 0 or f == 0:
        return y
    rows = min(rows, m)
    k_pad = triton.next_power_of_2(k)
    pdl = _pdl(x.device)
    grid = (triton.cdiv(f, block_n), triton.cdiv(m, rows))
    _rmsnorm_gemv_swiglu[grid](
        x, g, w, y, m, f, EPS, K=k, K_PAD=k_pad, BLOCK_N=block_n, ROWS=rows, PDL=pdl,
        num_warps=warps_for(block_n, k_pad, per_lane), launch_pdl=pdl,
    )  # fmt: skip
    return y

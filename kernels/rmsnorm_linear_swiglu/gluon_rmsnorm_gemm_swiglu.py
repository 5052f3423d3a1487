"""RMSNorm, the gate and up projections and SwiGLU in Gluon for Hopper (sm_90), for up to 16
rows of x a program: y = silu(s * (x g) W_g^T) * (s * (x g) W_u^T), s = rsqrt(mean(x^2) + eps),
with W streamed through a TMA ring by a loader warp of its own.

The Triton kernel (triton_rmsnorm_gemm_swiglu.py) waits on memory at 16 rows, as the
projections onto the residual stream do; gluon_gemm_residual.py (linear_residual) fed by a
loader warp ran those 0.5-0.8 % faster in the b16 blocks. Here a program takes 64 rows of the
gate's W and the same 64 of the up projection's (wgmma's height; W is the left operand, x g
the right, 16 wide). The loader brings each K step's two W tiles and x tile by TMA into a ring
of `num_stages` buffers (128-byte swizzled, 64 columns a chunk). The warpgroup reads the step's
x from the ring, sums x^2 for the norm and writes x g (rounded to x's dtype, as the eager norm
rounds) into one of two buffers of its own, which both products then read; the buffer's W
goes back to the loader once they are done. The warpgroup writes step j + 1's x g while step
j's products run (session 35's first version wrote it after they ended, with g loaded from
global memory in between: 3.7-14 % slower than the Triton kernel per op on an H100). After the last step it scales both sums by s,
applies SwiGLU in float32 and writes y (rounded once).

Launched with programmatic dependent launch: the loader asks for the ring's first W tiles,
which nothing earlier in the stream writes, before griddepcontrol.wait, and for x only after
it; g is read and y written only after the wait. The kernel after this one may launch right
after the wait, or with `late_dependents` only once the products end.

Runs on sm_90 with bf16 or fp16 contiguous inputs, K a multiple of 8 (TMA's 16-byte strides)
and 16-byte aligned x and w; anything else is a ValueError naming what (the Triton candidate
takes it). Gluon has no interpreter: the CPU tests build it for sm_90, and the GPU tests check
its outputs."""

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LANGUAGE = "triton"
PARAMS = {
    "block_k": [64, 128],
    "num_stages": [2, 3, 4, 5, 6, 8],
    "late_dependents": [False, True],
}
# Names in Triton 3.6 (the H200's) that later versions changed (CI builds with its own).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
SHARED_BYTES = 232448  # an sm_90 block's shared memory (227 KiB)
EPS = 1e-6
ROWS_W = 64  # W rows a program, of the gate's and of the up projection's
ROWS_X = 16  # x rows a program: the wgmma's width
CHUNK = 64  # columns of a shared-memory chunk (a 128-byte swizzled row)
BLOCK_W = gl.constexpr(ROWS_W)
BLOCK_X = gl.constexpr(ROWS_X)


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait: the kernel before this one has finished and its writes are seen."""
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _loader(w_desc, x_desc, w_smem, x_smem, ready, free, f0, F, m0, n_steps,
            CHUNKS: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: the first buffers' gate and up tiles before the wait, their x tiles after it,
    then each step's as soon as the warpgroup has given its buffer back (a fresh barrier passes
    the first wait, parity 1)."""
    step_bytes: gl.constexpr = CHUNKS * (2 * w_desc.block_type.nbytes + x_desc.block_type.nbytes)
    early = gl.minimum(n_steps, STAGES)
    for j in range(early):
        mbarrier.expect(ready.index(j), step_bytes)
        for c in gl.static_range(CHUNKS):
            k = (j * CHUNKS + c) * 64
            i = j * CHUNKS + c
            tma_load(w_desc, [f0, k], ready.index(j), w_smem.index(2 * i))
            tma_load(w_desc, [F + f0, k], ready.index(j), w_smem.index(2 * i + 1))
    _gdc_wait()
    for j in range(early):
        for c in gl.static_range(CHUNKS):
            k = (j * CHUNKS + c) * 64
            tma_load(x_desc, [m0, k], ready.index(j), x_smem.index(j * CHUNKS + c))
    for j in range(early, n_steps):
        stage = j % STAGES
        mbarrier.wait(free.index(stage), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(stage), step_bytes)
        for c in gl.static_range(CHUNKS):
            k = (j * CHUNKS + c) * 64
            i = stage * CHUNKS + c
            tma_load(w_desc, [f0, k], ready.index(stage), w_smem.index(2 * i))
            tma_load(w_desc, [F + f0, k], ready.index(stage), w_smem.index(2 * i + 1))
            tma_load(x_desc, [m0, k], ready.index(stage), x_smem.index(i))


@gluon.jit
def _stage_xg(x_smem, xg_smem, ready, g_ptr, j, K, squares, CHUNKS: gl.constexpr,
              STAGES: gl.constexpr):  # fmt: skip
    """Step j's x g into x g buffer j % 2, and x^2 into `squares`: g's loads are issued before
    the wait for the step's x, so their latency passes under it."""
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    k = j * CHUNKS * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, x_layout))
    g0 = gl.load(g_ptr + k, mask=k < K, other=0.0).to(gl.float32)
    g1 = g0
    if CHUNKS == 2:
        g1 = gl.load(g_ptr + k + 64, mask=k + 64 < K, other=0.0).to(gl.float32)
    stage = j % STAGES
    half = (j % 2) * CHUNKS
    mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
    xf = x_smem.index(stage * CHUNKS).load(x_layout).to(gl.float32)
    squares += gl.sum(xf * xf, axis=1)
    xg_smem.index(half).store((xf * gl.expand_dims(g0, 0)).to(xg_smem.dtype))
    if CHUNKS == 2:
        xf = x_smem.index(stage * CHUNKS + 1).load(x_layout).to(gl.float32)
        squares += gl.sum(xf * xf, axis=1)
        xg_smem.index(half + 1).store((xf * gl.expand_dims(g1, 0)).to(xg_smem.dtype))
    fence_async_shared()
    cta_barrier()  # every thread's x g in shared memory before the products read it
    return squares


@gluon.jit
def _products(w_smem, x_smem, xg_smem, ready, free, n_steps, g_ptr, y_ptr, M, F, K, f0, m0, eps,
              CHUNKS: gl.constexpr, STAGES: gl.constexpr,
              LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    """One warpgroup: the gate's and up's sums (64 W rows x 16 x rows each) of step j against
    x g buffer j % 2, while step j + 1's x g is written into the other; then the norm's scale,
    SwiGLU and y."""
    _gdc_wait()
    if not LATE_DEPENDENTS:
        _gdc_launch_dependents()
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_X, 16]
    )
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    gate = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, acc_layout)
    up = gl.zeros([BLOCK_W, BLOCK_X], gl.float32, acc_layout)
    squares = gl.zeros([BLOCK_X], gl.float32, gl.SliceLayout(1, x_layout))
    squares = _stage_xg(x_smem, xg_smem, ready, g_ptr, 0, K, squares, CHUNKS, STAGES)
    for j in range(n_steps):
        stage = j % STAGES
        half = (j % 2) * CHUNKS
        for c in gl.static_range(CHUNKS):
            i = stage * CHUNKS + c
            xg = xg_smem.index(half + c).permute((1, 0))
            gate = warpgroup_mma(w_smem.index(2 * i), xg, gate, is_async=True)
            up = warpgroup_mma(w_smem.index(2 * i + 1), xg, up, is_async=True)
        if j + 1 < n_steps:
            squares = _stage_xg(x_smem, xg_smem, ready, g_ptr, j + 1, K, squares, CHUNKS, STAGES)
        gate, up = warpgroup_mma_wait(num_outstanding=0, deps=(gate, up))
        mbarrier.arrive(free.index(stage))
    if LATE_DEPENDENTS:
        _gdc_launch_dependents()

    # gate[i, j] and up[i, j] are row m0 + j's sums for column f0 + i.
    out_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1])
    gate = gl.convert_layout(gate, out_layout)
    up = gl.convert_layout(up, out_layout)
    scale = gl.rsqrt(gl.convert_layout(squares, gl.SliceLayout(0, out_layout)) / K + eps)
    gate = gate * gl.expand_dims(scale, 0)
    up = up * gl.expand_dims(scale, 0)
    y = gate / (1.0 + gl.exp(-gate)) * up
    rf = f0 + gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
    rm = m0 + gl.arange(0, BLOCK_X, layout=gl.SliceLayout(0, out_layout))
    ok = gl.expand_dims(rf < F, 1) & gl.expand_dims(rm < M, 0)
    out = gl.expand_dims(rm.to(gl.int64) * F, 0) + gl.expand_dims(rf, 1)
    gl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=ok)


@gluon.jit
def _rmsnorm_gemm_swiglu(w_desc, x_desc, g_ptr, y_ptr, M, F, K, eps, BLOCK_K: gl.constexpr,
                         STAGES: gl.constexpr, LATE_DEPENDENTS: gl.constexpr):  # fmt: skip
    f0 = gl.program_id(0) * BLOCK_W
    m0 = gl.program_id(1) * BLOCK_X
    CHUNKS: gl.constexpr = BLOCK_K // 64
    n_steps = gl.cdiv(K, BLOCK_K)

    dtype: gl.constexpr = w_desc.dtype
    w_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS * 2, BLOCK_W, 64], w_desc.layout)
    x_smem = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_X, 64], x_desc.layout)
    xg_smem = gl.allocate_shared_memory(dtype, [2 * CHUNKS, BLOCK_X, 64], x_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    fence_async_shared()
    cta_barrier()
    gl.warp_specialize(
        [
            (_products, (w_smem, x_smem, xg_smem, ready, free, n_steps, g_ptr, y_ptr, M, F, K, f0,
                         m0, eps, CHUNKS, STAGES, LATE_DEPENDENTS)),
            (_loader, (w_desc, x_desc, w_smem, x_smem, ready, free, f0, F, m0, n_steps, CHUNKS,
                       STAGES)),
        ],
        [1],
        [24],
    )  # fmt: skip


def shared_bytes(block_k: int, stages: int) -> int:
    """Shared memory of a program: the ring of W (gate, up) and x tiles, the two x g buffers,
    the epilogue's float32 tile (its change of layout), barriers, with room."""
    ring = stages * block_k * (2 * ROWS_W + ROWS_X) * 2
    return ring + 2 * block_k * ROWS_X * 2 + ROWS_W * ROWS_X * 4 + 16 * stages + 1024


def _refusal(x, g, w, block_k: int, stages: int):
    """Why these inputs are not for this kernel at these parameters (None when they are)."""
    if x.dtype not in (torch.bfloat16, torch.float16) or {w.dtype, g.dtype} != {x.dtype}:
        return f"needs bf16 or fp16 inputs of one dtype; got {x.dtype}, {g.dtype}, {w.dtype}"
    if block_k not in (64, 128):
        return f"block_k {block_k}: 64 or 128 only"
    if stages < 2:
        return f"num_stages {stages}: the ring needs 2 buffers at least"
    if shared_bytes(block_k, stages) > SHARED_BYTES:
        return f"block_k {block_k} at {stages} stages needs {shared_bytes(block_k, stages)} bytes"
    k = x.shape[1]
    if k % 8:
        return f"k {k}: a multiple of 8 only (TMA's 16-byte row strides)"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "needs 16-byte aligned x and w (TMA)"
    if not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] != 9:
        return f"needs an sm_90 GPU (Hopper); got {x.device}"
    if w.device != x.device or g.device != x.device:
        return f"inputs on {x.device}, {g.device}, {w.device}"
    return None


@functools.cache
def _layout(rows: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for(
        [rows, CHUNK], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    )


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of the matrix `t` in rows x 64 tiles (out of bounds reads give zeros)."""
    return TensorDescriptor(
        t, list(t.shape), list(t.stride()), [rows, CHUNK], _layout(rows, t.dtype)
    )


def kernel(
    x: torch.Tensor,
    g: torch.Tensor,
    w: torch.Tensor,
    block_k: int = 64,
    num_stages: int = 5,
    late_dependents: bool = False,
) -> torch.Tensor:
    m, k = x.shape
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != k or g.shape != (k,):
        raise ValueError(
            f"w must be (2f, {k}) and g ({k},), got {tuple(w.shape)}, {tuple(g.shape)}"
        )
    f = w.shape[0] // 2
    if k == 0:
        raise ValueError("x must have at least one column: the norm of an empty row is undefined")
    x, g, w = x.contiguous(), g.contiguous(), w.contiguous()
    why = _refusal(x, g, w, block_k, num_stages)
    if why is not None:
        raise ValueError(
            f"gluon RMSNorm + gate/up + SwiGLU {why}; use triton_rmsnorm_gemm_swiglu.py"
        )
    y = torch.empty((m, f), device=x.device, dtype=x.dtype)
    if m == 0 or f == 0:
        return y
    grid = (triton.cdiv(f, ROWS_W), triton.cdiv(m, ROWS_X))
    with torch.cuda.device(x.device):
        _rmsnorm_gemm_swiglu[grid](
            _descriptor(w, ROWS_W), _descriptor(x, ROWS_X), g, y, m, f, k, EPS,
            BLOCK_K=block_k, STAGES=num_stages, LATE_DEPENDENTS=bool(late_dependents),
            num_warps=4, launch_pdl=True,
        )  # fmt: skip
    return y

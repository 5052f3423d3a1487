"""End-to-end decoder blocks built from swappable ops, to measure whether tuned kernels compound.

Two block kinds, one forward function each for a decode step, a prefill, and a chunk of a long
prompt's prefill onto the cache of its earlier tokens:

- `LlamaConfig`: a Llama-3-8B-like block (RMSNorm, fused QKV projection, NeoX rope, GQA
  attention, output projection, residual add + RMSNorm, merged gate/up projection, SwiGLU,
  down projection, residual add).
- `MlaConfig`: a DeepSeek-V3-like block with multi-head latent attention (low-rank q, a shared
  compressed KV latent plus a rope key; decode runs the weight-absorbed form over the latent
  cache, prefill and a chunk the expanded form) and a *dense* SwiGLU FFN: DeepSeek-V3's MoE
  layers are not modelled (a dense FFN of the first layers' width stands in for them).

Llama's block calls four fused ops: the input norms folded into the projections after them
(`rmsnorm_linear`: the qkv projection, or `rmsnorm_linear_rope` with rope after it;
`rmsnorm_linear_swiglu`: the MLP's gate+up projection with SwiGLU after it) and the residual
adds into the projections before them (`linear_residual`: the output and down projections).
At decode it calls `gqa_decode_residual` (the attention with the output projection and its
residual add after it) where a tuned kernel runs that in one. DeepSeek's calls the same ones,
`mla_rope_norm` (its queries' and key's rope and its latent's norm after the projections) and
`mla_decode_value` (the attention and its value projection).
Where no tuned kernel does one in one, it is the composition of the unfused ops, and where
neither the output projection's add nor the MLP's norm is fused, the two run as one
`add_rmsnorm`, so the block's math is the same either way.

The ops a block calls live in an `Ops` of plain callables, built three ways: `eager_ops()`
(plain torch, the tasks' reference math in the block's dtype) and `tuned_ops(dispatch_dir)` (per
call, the dispatch table of the op's task picks what won at the call's dims: a tuned candidate,
a vendor peer, or the eager op); `compiled_block` is torch.compile of a block's forward, the
tuned kernels opaque ops inside it.

A decode step takes the KV cache as an input that already holds the new token's slot (the
append is the caller's job): it attends over the whole cache and returns the new token's
cache entries with the block's output, so the work of computing them stays in the graph. A
chunked prefill step does the same for its chunk's tokens: the cache holds the prompt's earlier
tokens and the chunk's slots, and each of the chunk's tokens attends to every token before it
and itself (the chunk is the cache's last tokens).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from loop.dispatch import Choice, load
from loop.guards import declares_strided_inputs
from loop.tasks import Task, TaskError, load_task

EPS = 1e-6
# mla_decode's kernels fix the softmax scale at 1/sqrt(192) (DeepSeek-V3's 128 + 64); blocks of
# other sizes rescale the queries so the effective scale is theirs.
MLA_TASK_SCALE_DIM = 192


# --------------------------------------------------------------------------------- configs


def _check_positive(cfg: object) -> None:
    for f in fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if f.type in ("int", int) and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(
                f"{type(cfg).__name__}.{f.name} must be a positive integer, got {value!r}"
            )


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-like decoder block; the defaults are Llama-3-8B's."""

    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    theta: float = 500000.0

    def __post_init__(self) -> None:
        _check_positive(self)
        if self.heads % self.kv_heads:
            raise ValueError(
                f"LlamaConfig.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even, got {self.head_dim}")

    @property
    def kind(self) -> str:
        return "llama"


@dataclass(frozen=True)
class MlaConfig:
    """A DeepSeek-like block with MLA attention and a dense SwiGLU FFN; defaults are V3's."""

    hidden: int = 7168
    heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_dim: int = 128
    rope_dim: int = 64
    v_head_dim: int = 128
    ffn: int = 18432
    theta: float = 10000.0

    def __post_init__(self) -> None:
        _check_positive(self)
        if self.rope_dim % 2:
            raise ValueError(f"MlaConfig.rope_dim must be even, got {self.rope_dim}")

    @property
    def kind(self) -> str:
        return "mla"


BlockConfig = LlamaConfig | MlaConfig


def weight_shapes(cfg: BlockConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of the block by name (linear weights as nn.Linear stores them: (out, in))."""
    if isinstance(cfg, LlamaConfig):
        qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
        return {
            "attn_norm": (cfg.hidden,),
            "wqkv": (qkv, cfg.hidden),
            "wo": (cfg.hidden, cfg.heads * cfg.head_dim),
            "ffn_norm": (cfg.hidden,),
            "w_gate_up": (2 * cfg.ffn, cfg.hidden),
            "w_down": (cfg.hidden, cfg.ffn),
        }
    qk_head = cfg.qk_nope_dim + cfg.rope_dim
    return {
        "attn_norm": (cfg.hidden,),
        # DeepSeek's q_a_proj and kv_a_proj_with_mqa stacked, as vLLM and SGLang fuse them
        "wqkv_a": (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.rope_dim, cfg.hidden),
        "q_norm": (cfg.q_lora_rank,),
        "wq_b": (cfg.heads * qk_head, cfg.q_lora_rank),
        "kv_norm": (cfg.kv_lora_rank,),
        # wkv_b of DeepSeek's checkpoint, split per head into its key and value halves, the key
        # half transposed (latent rows) for the absorbed query, as vLLM keeps it (W_UK_T).
        "w_uk": (cfg.heads, cfg.kv_lora_rank, cfg.qk_nope_dim),
        "w_uv": (cfg.heads, cfg.v_head_dim, cfg.kv_lora_rank),
        "wo": (cfg.hidden, cfg.heads * cfg.v_head_dim),
        "ffn_norm": (cfg.hidden,),
        "w_gate_up": (2 * cfg.ffn, cfg.hidden),
        "w_down": (cfg.hidden, cfg.ffn),
    }


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on a GPU, float32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def make_weights(
    cfg: BlockConfig, device: str | torch.device = "cpu", seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random weights scaled so activations stay of order one: linear weights ~ N(0, 1/fan_in),
    norm weights ~ 1 + N(0, 0.1^2). Drawn on the device, in `default_dtype(device)`."""
    dtype = default_dtype(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        # A norm weight is one vector; a linear (or per-head) weight maps its last dim.
        scaled = w.mul_(0.1).add_(1.0) if len(shape) == 1 else w.mul_(shape[-1] ** -0.5)
        out[name] = scaled.to(dtype)
    return out


def param_count(cfg: BlockConfig) -> int:
    return sum(math.prod(s) for s in weight_shapes(cfg).values())


def kv_cache_elements(cfg: BlockConfig, batch: int, context: int) -> int:
    if isinstance(cfg, LlamaConfig):
        return 2 * batch * cfg.kv_heads * context * cfg.head_dim
    return batch * context * (cfg.kv_lora_rank + cfg.rope_dim)


def bytes_streamed(cfg: BlockConfig, batch: int, context: int, itemsize: int = 2) -> int:
    """Bytes a decode step must read at least: every weight once and the whole KV cache once."""
    return itemsize * (param_count(cfg) + kv_cache_elements(cfg, batch, context))


# ------------------------------------------------------------------------------------- ops


@dataclass
class Ops:
    """The ops a block calls. Layouts are the tasks' (kernels/<task>/task.py), except that
    `attention_prefill` takes k and v with kv_heads heads (GQA)."""

    rmsnorm: Callable  # (x (T, H), w) -> y
    add_rmsnorm: Callable  # (x, residual, w) -> (y, x + residual)
    rope: Callable  # (x (T, heads, d), cos (T, d/2), sin) -> y
    swiglu: Callable  # (x (T, 2F)) -> (T, F)
    attention_decode: Callable  # (q (B, Hq, d), k_cache (B, Hkv, L, d), v_cache) -> (B, Hq, d)
    attention_prefill: Callable  # (q (B, Hq, T, d), k (B, Hkv, L, d), v) -> (B, Hq, T, d)
    # MLA's prefill, expanded: (q (B, H, T, d), k (B, H, L, d), v (B, H, L, dv < d)) -> dv wide
    mla_attention_prefill: Callable
    mla_decode: Callable  # (q_nope (B, H, C), q_pe (B, H, R), ckv (B, L, C), kpe (B, L, R))
    head_gemv: Callable  # (x (B, H, K), w (H, N, K)) -> (B, H, N): MLA's absorbed projections
    linear: Callable  # (x (M, K), w (N, K)) -> (M, N)
    # Fused: linear(rmsnorm(x, g), w), and linear(x, w) + r. Where no tuned kernel does them in
    # one, they are those compositions of the ops above.
    rmsnorm_linear: Callable | None = None  # (x (M, K), g (K,), w (N, K)) -> (M, N)
    linear_residual: Callable | None = None  # (x (M, K), w (N, K), r (M, N)) -> (M, N)
    # And swiglu(rmsnorm_linear(x, g, w)): the MLP's norm, gate and up projections and SwiGLU;
    # and (rope(rmsnorm_linear(x, g, w_qk)), rmsnorm_linear(x, g, w_v)): the attention's input.
    rmsnorm_linear_swiglu: Callable | None = None  # (x (M, K), g (K,), w (2F, K)) -> (M, F)
    # (x, g, w_qk (Nqk, K), w_v (Nv, K), cos (M, d/2), sin) -> (qk (M, Nqk), v (M, Nv))
    rmsnorm_linear_rope: Callable | None = None
    # MLA's (rope(q's rope parts), rmsnorm(latent, g), rope(the rope key)) after its projections:
    # (q (T, H, nope + R), kv (T, C + R), g (C,), cos (T, R/2), sin) -> (q_pe, ckv, kpe)
    mla_rope_norm: Callable | None = None
    # head_gemv(mla_decode(q_nope, q_pe, ckv, kpe), w_uv): the attention and its value projection
    mla_decode_value: Callable | None = None
    # linear_residual(attention_decode(q, k, v) flattened over its heads, w_o, r): Llama's
    # attention at decode, its output projection and the residual add
    gqa_decode_residual: Callable | None = None
    # (op name, *the op's arguments) -> whether a tuned kernel runs that call (a constant to
    # torch.compile); the eager ops run none.
    is_kernel: Callable[..., bool] = lambda op, *args: False
    label: str = "eager"
    notes: list[str] = field(default_factory=list)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * w.float()).to(x.dtype)


def _add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor):
    h = x + residual
    return _rmsnorm(h, w), h


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    group = heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _attention_decode(q, k_cache, v_cache) -> torch.Tensor:
    """transformers' SDPA path at decode: the cache expanded to the query heads."""
    k, v = _repeat_kv(k_cache, q.shape[1]), _repeat_kv(v_cache, q.shape[1])
    return F.scaled_dot_product_attention(q[:, :, None, :], k, v)[:, :, 0, :]


def _attention_prefill(q, k, v) -> torch.Tensor:
    """Causal; with fewer queries than keys, the queries are the last tokens (a chunk of a
    prompt after its cached tokens), as in the prefill_attention task."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    if q.shape[2] == k.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2])
    )


def _mla_decode(q_nope, q_pe, ckv, kpe) -> torch.Tensor:
    """DeepSeek-V3's absorbed decode: einsums in the model dtype, softmax in fp32."""
    scores = (
        torch.einsum("bhc,btc->bht", q_nope, ckv) + torch.einsum("bhr,btr->bht", q_pe, kpe)
    ) / math.sqrt(MLA_TASK_SCALE_DIM)
    probs = scores.softmax(dim=-1, dtype=torch.float32).type_as(q_nope)
    return torch.einsum("bht,btc->bhc", probs, ckv)


def _head_gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One batched matmul over the heads (cuBLAS), as DeepSeek's absorbed decode runs it."""
    return torch.bmm(x.transpose(0, 1), w.transpose(1, 2)).transpose(0, 1)


def _mla_rope_norm(ops: Ops, q, kv, g, cos, sin):
    """rope(q's rope parts), rmsnorm(the latent, g) and rope(the rope key) with `ops`' own."""
    r = 2 * cos.shape[1]
    latent = kv.shape[1] - r
    return (
        ops.rope(q[..., q.shape[-1] - r :], cos, sin),
        ops.rmsnorm(kv[:, :latent], g),
        ops.rope(kv[:, None, latent:], cos, sin)[:, 0],
    )


# Each fused op as the composition of an Ops' own unfused ones (tuned or eager).
_COMPOSED: dict[str, Callable[[Ops], Callable]] = {
    "rmsnorm_linear": lambda ops: lambda x, g, w: ops.linear(ops.rmsnorm(x, g), w),
    "linear_residual": lambda ops: lambda x, w, r: ops.linear(x, w) + r,
    "rmsnorm_linear_swiglu": lambda ops: lambda x, g, w: ops.swiglu(ops.rmsnorm_linear(x, g, w)),
    "rmsnorm_linear_rope": lambda ops: (
        lambda x, g, w_qk, w_v, cos, sin: (
            ops.rope(
                ops.rmsnorm_linear(x, g, w_qk).reshape(x.shape[0], -1, 2 * cos.shape[1]), cos, sin
            ).reshape(x.shape[0], -1),
            ops.rmsnorm_linear(x, g, w_v),
        )
    ),
    "mla_rope_norm": lambda ops: functools.partial(_mla_rope_norm, ops),
    "mla_decode_value": lambda ops: (
        lambda q_nope, q_pe, ckv, kpe, w_uv: ops.head_gemv(
            ops.mla_decode(q_nope, q_pe, ckv, kpe), w_uv
        )
    ),
    "gqa_decode_residual": lambda ops: (
        lambda q, k, v, w_o, r: ops.linear_residual(
            ops.attention_decode(q, k, v).reshape(q.shape[0], -1), w_o, r
        )
    ),
}
FUSED = tuple(_COMPOSED)


def eager_ops() -> Ops:
    ops = Ops(
        rmsnorm=_rmsnorm,
        add_rmsnorm=_add_rmsnorm,
        rope=_rope,
        swiglu=_swiglu,
        attention_decode=_attention_decode,
        attention_prefill=_attention_prefill,
        mla_attention_prefill=_attention_prefill,
        mla_decode=_mla_decode,
        head_gemv=_head_gemv,
        linear=F.linear,
    )
    for op in FUSED:
        setattr(ops, op, _COMPOSED[op](ops))
    return ops


# ------------------------------------------------------------------------------- tuned ops


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _gqa_decode_dims(q: torch.Tensor, k_cache: torch.Tensor) -> dict:
    """The GQA decode attention's dims, from q (B, Hq, d) and the cache (B, Hkv, L, d)."""
    b, hq, d = q.shape
    hkv, kv_len = k_cache.shape[1], k_cache.shape[2]
    return {"batch": b, "q_heads": hq, "kv_heads": hkv, "head_dim": d, "kv_len": kv_len}


# For each op: its task, the dims its dispatch table is keyed on (from the call's arguments),
# and an adapter from the block's call to the task kernel's layout.
_DIMS: dict[str, tuple[str, Callable[..., dict]]] = {
    "rmsnorm": ("rmsnorm", lambda x, w: {"tokens": x.shape[0], "hidden": x.shape[1]}),
    "add_rmsnorm": (
        "add_rmsnorm",
        lambda x, r, w: {"tokens": x.shape[0], "hidden": x.shape[1]},
    ),
    "rope": (
        "rope",
        lambda x, c, s: {"tokens": x.shape[0], "heads": x.shape[1], "head_dim": x.shape[2]},
    ),
    "swiglu": ("swiglu", lambda x: {"tokens": x.shape[0], "ffn": x.shape[1] // 2}),
    "attention_decode": ("gqa_decode", lambda q, k, v: _gqa_decode_dims(q, k)),
    "attention_prefill": (
        "prefill_attention",
        lambda q, k, v: {
            "batch": q.shape[0],
            "heads": q.shape[1],
            "head_dim": q.shape[3],
            "q_len": q.shape[2],
            "kv_len": k.shape[2],
        },
    ),
    "mla_attention_prefill": (
        "mla_prefill_attention",
        lambda q, k, v: {
            "batch": q.shape[0],
            "heads": q.shape[1],
            "head_dim": q.shape[3],
            "v_head_dim": v.shape[3],
            "q_len": q.shape[2],
            "kv_len": k.shape[2],
        },
    ),
    "mla_decode": (
        "mla_decode",
        lambda qn, qp, ckv, kpe: {
            "batch": qn.shape[0],
            "heads": qn.shape[1],
            "kv_lora_rank": qn.shape[2],
            "rope_dim": qp.shape[2],
            "kv_len": ckv.shape[1],
        },
    ),
    "head_gemv": (
        "head_gemv",
        lambda x, w: {"batch": x.shape[0], "heads": x.shape[1], "n": w.shape[1], "k": x.shape[2]},
    ),
    "linear": ("skinny_gemm", lambda x, w: {"m": x.shape[0], "n": w.shape[0], "k": x.shape[1]}),
    # The fused ops come last: where they have no kernel, they compose the tuned ops above.
    "rmsnorm_linear": (
        "rmsnorm_linear",
        lambda x, g, w: {"m": x.shape[0], "n": w.shape[0], "k": x.shape[1]},
    ),
    "linear_residual": (
        "linear_residual",
        lambda x, w, r: {"m": x.shape[0], "n": w.shape[0], "k": x.shape[1]},
    ),
    # after rmsnorm_linear, which their compositions call
    "rmsnorm_linear_swiglu": (
        "rmsnorm_linear_swiglu",
        lambda x, g, w: {"m": x.shape[0], "f": w.shape[0] // 2, "k": x.shape[1]},
    ),
    "rmsnorm_linear_rope": (
        "rmsnorm_linear_rope",
        lambda x, g, w_qk, w_v, c, s: {
            "m": x.shape[0],
            "n_qk": w_qk.shape[0],
            "n_v": w_v.shape[0],
            "head_dim": 2 * c.shape[1],
            "k": x.shape[1],
        },
    ),
    "mla_rope_norm": (
        "mla_rope_norm",
        lambda q, kv, g, c, s: {
            "tokens": q.shape[0],
            "heads": q.shape[1],
            "nope_dim": q.shape[2] - 2 * c.shape[1],
            "rope_dim": 2 * c.shape[1],
            "kv_lora_rank": kv.shape[1] - 2 * c.shape[1],
        },
    ),
    "mla_decode_value": (
        "mla_decode_value",
        lambda qn, qp, ckv, kpe, w: {
            "batch": qn.shape[0],
            "heads": qn.shape[1],
            "kv_lora_rank": qn.shape[2],
            "rope_dim": qp.shape[2],
            "v_head_dim": w.shape[1],
            "kv_len": ckv.shape[1],
        },
    ),
    "gqa_decode_residual": (
        "gqa_decode_residual",
        lambda q, k, v, w_o, r: {**_gqa_decode_dims(q, k), "hidden": w_o.shape[0]},
    ),
}


def _load_module(path: Path):
    """A candidate module by file path. Trusted: it comes from a task folder and its entry in a
    dispatch table means the evaluator accepted it (correctness, guards) on this task."""
    name = f"autotune_block_{path.parent.name}_{path.stem}".replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _workspace_source(run_dir: Path, task_name: str, commit: str, name: str) -> Path | None:
    """The candidate's source at the table's commit, from the run's workspace repositories
    (`<run>/workspace/<study>/`, where the loop commits every kept edit), copied to a temporary
    file; None when there is no commit or no workspace holds it (the shipped file is used)."""
    if not commit:
        return None
    for repo in sorted((run_dir / "workspace").glob("*/.git")):
        done = subprocess.run(
            ["git", "-C", str(repo.parent), "show", f"{commit}:{task_name}/{name}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            folder = run_dir / ".block-sources"  # kept with the run it came from
            folder.mkdir(exist_ok=True)
            path = folder / f"{task_name}_{commit[:12]}_{name}"
            path.write_text(done.stdout)
            return path
    return None


def candidate_source(table_dir: Path, task: Task, commit: str, name: str) -> tuple[Path, str]:
    """A dispatch entry's candidate file and where it came from: its source at the entry's
    commit from the run's workspace ("workspace commit"), else the task folder's ("task
    folder")."""
    path = _workspace_source(table_dir.resolve(), task.name, commit, name)
    return (path, "workspace commit") if path else (task.folder / name, "task folder")


def _contiguous(args: tuple) -> tuple:
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


# Tuned kernels run through one opaque custom op, so that `torch.compile` of a tuned block
# compiles (and fuses) everything around them instead of tracing into, or breaking at, a
# candidate's launch code: _KERNELS[i] is (kernel, eager op), the eager op giving the outputs'
# shapes and dtypes while tracing.
_KERNELS: list[tuple[Callable, Callable]] = []


def _as_list(out) -> list[torch.Tensor]:
    return [t.contiguous() for t in (out if isinstance(out, (tuple, list)) else (out,))]


@torch.library.custom_op("autotune::tuned_kernel", mutates_args=())
def _tuned_kernel(args: list[torch.Tensor], index: int) -> list[torch.Tensor]:
    # A custom op's outputs may share memory with neither its inputs nor each other (a kernel
    # may return two views of one buffer, which the evaluator accepts).
    seen = {a.untyped_storage().data_ptr() for a in args}
    outs = []
    for out in _as_list(_KERNELS[index][0](*args)):
        if out.untyped_storage().data_ptr() in seen:
            out = out.clone()
        seen.add(out.untyped_storage().data_ptr())
        outs.append(out)
    return outs


@_tuned_kernel.register_fake
def _tuned_kernel_fake(args: list[torch.Tensor], index: int) -> list[torch.Tensor]:
    return _as_list(_KERNELS[index][1](*args))


def _attention_prefill_shape(q, k, v) -> torch.Tensor:
    """The prefill attention's output, uncomputed (B, heads, queries, v's head_dim)."""
    return q.new_empty(*q.shape[:-1], v.shape[-1])


# The outputs of eager ops that cannot run on the compiler's fake tensors: the causal mask of a
# chunk's queries onto a longer cache (a tensor subclass) cannot be made of one.
_SHAPES_ONLY: dict[str, Callable] = {
    "attention_prefill": _attention_prefill_shape,
    "mla_attention_prefill": _attention_prefill_shape,
}


# Numbers the tuned ops, for the calls dynamo traces (an int is a constant to every torch
# version's dynamo, and guarded by value; an object argument to an assumed-constant function
# fails to trace in torch 2.11).
_OP_IDS = itertools.count()


def _tuned_op(op: str, table: Path, eager: Callable, notes: list[str]) -> Callable:
    """`eager` with the dispatch table's choice swapped in, resolved once per distinct dims. The
    choice is made from the arguments' shapes and dtype, a constant while `torch.compile`
    traces (its blocks are specialised per shape): where a peer wins, the eager op or the
    peer's own torch code is traced and compiled; where a candidate wins, the compiled graph
    calls it as one opaque op. A task bucketed on rows (m: the skinny GEMMs, fused or not)
    serves only the rows it was tuned for."""
    task_name, dims_of = _DIMS[op]
    task = load_task(task_name)
    skip = _skinny_only if task.bucket_key == "m" else None
    pick = load(table)
    modules: dict[Path, object] = {}

    def resolve(dims: dict) -> tuple[Callable, bool]:
        """What runs at `dims`, and whether it is a candidate's kernel (opaque to the compiler)
        rather than torch code the compiler traces."""
        where = f"{op} ({task_name}) at {dims}"
        try:
            choice = pick(**dims)
        except LookupError:
            notes.append(f"{where}: no dispatch entry, eager")
            return eager, False
        if choice.source != "candidate":
            # The winning peer runs: a vendor path (cuBLAS, SDPA with enable_gqa) is the task's
            # function; torch.compile, or the task's eager, is the block's eager op (compiled in
            # the compiled tuned block).
            peer = task.module.PEERS.get(choice.name)
            if peer is None or choice.name == "eager":
                notes.append(f"{where}: peer {choice.name!r} wins, eager")
                return eager, False
            notes.append(f"{where}: peer {choice.name!r} wins, the task's {choice.name}")
            return peer, False
        if skip is not None and skip(dims, choice):
            notes.append(f"{where}: outside the tuned range ({choice.shape}), eager")
            return eager, False
        path, origin = candidate_source(table.parent, task, choice.commit, choice.name)
        if not path.is_file():
            notes.append(f"{where}: candidate {choice.name} not in {task.folder}, eager")
            return eager, False
        if path not in modules:
            modules[path] = _load_module(path)
        notes.append(f"{where}: {choice.name} ({origin}) {choice.params} (tuned on {choice.shape})")
        kernel = functools.partial(modules[path].kernel, **choice.params)
        # The evaluator gives candidates contiguous inputs, and one that declares STRIDED_INPUTS
        # views too; such a one takes the block's views as they come (a query slice, say).
        as_given = declares_strided_inputs(modules[path])
        refused = False

        def run_kernel(*args):
            # A candidate refuses inputs it cannot run with a ValueError naming why (a cache
            # length off its tile, say, though the table's bucket holds it): eager runs them.
            nonlocal refused
            if not refused:
                try:
                    return kernel(*(args if as_given else _contiguous(args)))
                except ValueError as exc:
                    refused = True
                    notes.append(f"{where}: {choice.name} refused the inputs ({exc}), eager")
            return eager(*args)

        return run_kernel, True

    # What the compiler traces is fixed before any tracing: dynamo reads a list once per frame,
    # so one that grew between two call sites of this op would be read stale. Kernels go into
    # _KERNELS, which only the custom op reads.
    traced = [eager, *task.module.PEERS.values()]
    # What the custom op's fake runs while the compiler traces, for the outputs' shapes: the
    # plain eager op, not `eager`, whose composition of tuned ops would consult their tables at
    # dims the block never runs them at (and note them).
    shapes_of = _SHAPES_ONLY.get(op) or getattr(eager_ops(), op)
    resolved: dict[tuple, tuple[int | None, int | None]] = {}
    # Every tuned op's `run` shares one code object, and an assumed-constant result is not
    # guarded: passing this op's own number makes dynamo guard on it, so a block compiled from
    # another table never reuses this one's graph.
    this_op = next(_OP_IDS)

    @torch.compiler.assume_constant_result
    def index_of(op_id: int, key: tuple) -> tuple[int | None, int | None]:
        """(i, None) runs traced[i], torch code the compiler traces; (None, i) runs _KERNELS[i]
        as one opaque op."""
        if key not in resolved:
            fn, opaque = resolve(dict(key))
            if opaque:
                _KERNELS.append((fn, shapes_of))
                resolved[key] = (None, len(_KERNELS) - 1)
            else:
                resolved[key] = (traced.index(fn), None)
        return resolved[key]

    def key_of(args: tuple) -> tuple:
        return tuple(sorted({**dims_of(*args), "dtype": _dt(args[0])}.items()))

    def run(*args):
        traced_index, kernel_index = index_of(this_op, key_of(args))
        if kernel_index is None:
            return traced[traced_index](*args)
        outs = _tuned_kernel(list(args), kernel_index)
        return tuple(outs) if len(outs) > 1 else outs[0]

    def is_kernel(*args) -> bool:
        """Whether a call with these arguments runs a tuned kernel."""
        return index_of(this_op, key_of(args))[1] is not None

    run.is_kernel = is_kernel
    return run


def _skinny_only(dims: dict, choice: Choice) -> bool:
    """A skinny GEMM (fused or not) serves the row counts it was tuned for, not a 4096-row
    prefill."""
    bucket = _bucket_of(choice.shape)
    return bucket is not None and dims["m"] > bucket


def _bucket_of(shape_name: str) -> int | None:
    head = shape_name.split("-")[0]
    return int(head[1:]) if head.startswith("m") and head[1:].isdigit() else None


def _gqa_prefill(kernel: Callable) -> Callable:
    """The prefill task has as many KV heads as query heads: expand GQA's KV (as the eager op
    does)."""

    def run(q, k, v):
        return kernel(q, _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1]))

    return run


def tuned_ops(dispatch_dir: str | Path | None, device: str | torch.device = "cpu") -> Ops:
    """Eager ops with, for each op whose task has `dispatch-<task>.json` in `dispatch_dir` (the
    run directory of `autotune run`), the table's winning candidate and params for the call's
    dims. Where the table names a vendor peer (SDPA with enable_gqa, cuBLAS), that peer's
    function runs; where it names eager or torch.compile, has no entry for the dims, or there
    is no table, the op stays eager; `ops.notes` says what each op resolved to."""
    del device  # candidates run on their inputs' device
    ops = eager_ops()
    ops.label = "tuned"
    folder = Path(dispatch_dir) if dispatch_dir is not None else None
    if folder is None or not folder.is_dir():
        ops.notes.append(f"no dispatch directory at {folder}: tuned ops are the eager ops")
        return ops
    found = 0
    kernel_checks: dict[str, Callable[..., bool]] = {}
    ops.is_kernel = lambda op, *args: op in kernel_checks and kernel_checks[op](*args)
    for op, (task_name, _) in _DIMS.items():
        if op in FUSED:
            setattr(ops, op, _COMPOSED[op](ops))  # of the tuned ops set so far
        table = folder / f"dispatch-{task_name}.json"
        if not table.is_file():
            continue
        eager = getattr(ops, op)
        try:
            tuned = _tuned_op(op, table, eager, ops.notes)
        except (LookupError, TaskError, ValueError, OSError) as exc:
            ops.notes.append(f"{table}: unusable ({exc}), {op} stays eager")
            continue
        kernel_checks[op] = tuned.is_kernel
        if op == "attention_prefill":
            tuned = _gqa_prefill(tuned)
        setattr(ops, op, tuned)
        found += 1
    if not found:
        ops.notes.append(f"no dispatch-<task>.json in {folder}: tuned ops are the eager ops")
    return ops


# ---------------------------------------------------------------------------------- blocks


@dataclass
class Block:
    """A block's forward functions over fixed weights; see `make_inputs` for their inputs."""

    cfg: BlockConfig
    decode: Callable[..., tuple[torch.Tensor, ...]]
    prefill: Callable[..., tuple[torch.Tensor, ...]]
    chunk: Callable[..., tuple[torch.Tensor, ...]]
    label: str = "eager"


def _mlp(ops: Ops, w: dict[str, torch.Tensor], attn: torch.Tensor, x: torch.Tensor):
    """The output projection onto the residual stream x, then the norm, the SwiGLU MLP and its
    down projection onto the stream: the fused ops where a kernel runs them, else one
    `add_rmsnorm` for the projection's add and the MLP's norm."""
    wo, norm, w_gate_up = w["wo"], w["ffn_norm"], w["w_gate_up"]
    norm_fused = ops.is_kernel("rmsnorm_linear_swiglu", x, norm, w_gate_up) or ops.is_kernel(
        "rmsnorm_linear", x, norm, w_gate_up
    )
    if norm_fused or ops.is_kernel("linear_residual", attn, wo, x):
        return _ffn(ops, w, ops.linear_residual(attn, wo, x))
    # neither is fused here: the residual add and the norm in one op
    y, h = ops.add_rmsnorm(ops.linear(attn, wo), x, norm)
    return ops.linear_residual(ops.swiglu(ops.linear(y, w_gate_up)), w["w_down"], h)


def _ffn(ops: Ops, w: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """The norm, the SwiGLU MLP and its down projection onto the residual stream h."""
    act = ops.rmsnorm_linear_swiglu(h, w["ffn_norm"], w["w_gate_up"])
    return ops.linear_residual(act, w["w_down"], h)


def _llama_block(cfg: LlamaConfig, w: dict[str, torch.Tensor], ops: Ops) -> Block:
    nq, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim

    def attention_in(x, cos, sin):
        norm, wqkv, n_qk = w["attn_norm"], w["wqkv"], (nq + nkv) * d
        w_qk, w_v = wqkv[:n_qk], wqkv[n_qk:]  # row ranges: no copies
        if ops.is_kernel("rmsnorm_linear_rope", x, norm, w_qk, w_v, cos, sin):
            qk, v = ops.rmsnorm_linear_rope(x, norm, w_qk, w_v, cos, sin)
            qk = qk.reshape(-1, nq + nkv, d)
        else:  # one projection, then q's and k's heads rotated in one call: two kernels
            qkv = ops.rmsnorm_linear(x, norm, wqkv)
            qk = ops.rope(qkv[:, :n_qk].reshape(-1, nq + nkv, d), cos, sin)
            v = qkv[:, n_qk:]
        q, k = qk.split([nq, nkv], dim=1)
        return q, k, v.reshape(-1, nkv, d)

    def decode(x, k_cache, v_cache, cos, sin):
        """x (B, hidden); caches (B, kv_heads, L, d) holding the new token's slot; cos and sin
        (B, d/2) at the new token's position. Returns (out, k_new, v_new)."""
        q, k, v = attention_in(x, cos, sin)
        if ops.is_kernel("gqa_decode_residual", q, k_cache, v_cache, w["wo"], x):
            h = ops.gqa_decode_residual(q, k_cache, v_cache, w["wo"], x)
            return _ffn(ops, w, h), k, v
        attn = ops.attention_decode(q, k_cache, v_cache)
        return _mlp(ops, w, attn.reshape(x.shape[0], nq * d), x), k, v

    def prefill(x, cos, sin):
        """x (B, T, hidden); cos and sin (T, d/2). Causal over the T tokens. Returns (out,)."""
        b, t, hidden = x.shape
        flat = x.reshape(b * t, hidden)
        cos_t, sin_t = cos.repeat(b, 1), sin.repeat(b, 1)
        q, k, v = attention_in(flat, cos_t, sin_t)
        heads = [z.reshape(b, t, -1, d).transpose(1, 2) for z in (q, k, v)]
        attn = ops.attention_prefill(*heads).transpose(1, 2).reshape(b * t, nq * d)
        return (_mlp(ops, w, attn, flat).reshape(b, t, hidden),)

    def chunk(x, k_cache, v_cache, cos, sin):
        """x (B, T, hidden), a prompt's next T tokens; caches (B, kv_heads, L, d) holding the
        prompt's L - T tokens before them and the chunk's T slots; cos and sin (T, d/2) at
        positions L - T to L - 1. Returns (out (B, T, hidden), k_new, v_new (B, T, kv_heads,
        d))."""
        b, t, hidden = x.shape
        flat = x.reshape(b * t, hidden)
        q, k, v = attention_in(flat, cos.repeat(b, 1), sin.repeat(b, 1))
        attn = ops.attention_prefill(q.reshape(b, t, nq, d).transpose(1, 2), k_cache, v_cache)
        out = _mlp(ops, w, attn.transpose(1, 2).reshape(b * t, nq * d), flat)
        return out.reshape(b, t, hidden), k.reshape(b, t, nkv, d), v.reshape(b, t, nkv, d)

    return Block(cfg, decode, prefill, chunk, ops.label)


def _mla_block(cfg: MlaConfig, w: dict[str, torch.Tensor], ops: Ops) -> Block:
    nh, c, r, dn, dv = cfg.heads, cfg.kv_lora_rank, cfg.rope_dim, cfg.qk_nope_dim, cfg.v_head_dim
    # The kernels' scale is 1/sqrt(192); this factor on the queries makes it 1/sqrt(dn + r).
    q_rescale = math.sqrt(MLA_TASK_SCALE_DIM / (dn + r))

    def projections(x, cos, sin):
        qkv_a = ops.rmsnorm_linear(x, w["attn_norm"], w["wqkv_a"])
        q_a, kv = qkv_a.split([cfg.q_lora_rank, c + r], dim=1)
        q = ops.rmsnorm_linear(q_a, w["q_norm"], w["wq_b"]).reshape(-1, nh, dn + r)
        q_pe, ckv, kpe = ops.mla_rope_norm(q, kv, w["kv_norm"], cos, sin)
        return q[..., :dn], q_pe, ckv, kpe

    def decode(x, ckv_cache, kpe_cache, cos, sin):
        """x (B, hidden); ckv_cache (B, L, kv_lora_rank) and kpe_cache (B, L, rope_dim) holding
        the new token's slot; cos and sin (B, rope_dim/2). Returns (out, ckv_new, kpe_new)."""
        q_nope, q_pe, ckv, kpe = projections(x, cos, sin)
        # Absorb the key up-projection into the query: dn -> C a head.
        q_lat = ops.head_gemv(q_nope, w["w_uk"])
        if q_rescale != 1.0:
            q_lat, q_pe = q_lat * q_rescale, q_pe * q_rescale
        # The attention, then the value up-projection: C -> dv a head.
        o = ops.mla_decode_value(
            q_lat.contiguous(), q_pe.contiguous(), ckv_cache, kpe_cache, w["w_uv"]
        )
        return _mlp(ops, w, o.reshape(x.shape[0], nh * dv), x), ckv, kpe

    def expanded(x, ckv_cache, kpe_cache, cos, sin):
        """The prefill form of the attention, for x (B, T, hidden), the last T tokens of the
        caches (B, L, kv_lora_rank) and (B, L, rope_dim) (None: the T tokens' own entries);
        cos and sin (T, rope_dim/2): every head's key (nope + the shared rope key) and value
        expanded from the latent cache, the T queries attending causally over them. Returns
        (out (B, T, hidden), the tokens' ckv (B, T, kv_lora_rank) and kpe (B, T, rope_dim))."""
        b, t, hidden = x.shape
        flat = x.reshape(b * t, hidden)
        q_nope, q_pe, ckv, kpe = projections(flat, cos.repeat(b, 1), sin.repeat(b, 1))
        ckv, kpe = ckv.reshape(b, t, c), kpe.reshape(b, t, r)
        ckv_cache = ckv if ckv_cache is None else ckv_cache
        kpe_cache = kpe if kpe_cache is None else kpe_cache
        length = ckv_cache.shape[1]
        k_nope = torch.einsum("blc,hcd->bhld", ckv_cache, w["w_uk"])
        k = torch.cat([k_nope, kpe_cache[:, None].expand(b, nh, length, r)], dim=-1)
        # As model code does (one linear, then heads): v's last dim is contiguous by
        # construction, which SDPA's memory-efficient backend needs (its math backend would
        # materialise the scores: 32 GiB at a 4k chunk of 32k).
        v = F.linear(ckv_cache, w["w_uv"].reshape(nh * dv, c)).view(b, length, nh, dv)
        v = v.transpose(1, 2)
        q = torch.cat([q_nope, q_pe], dim=-1).reshape(b, t, nh, dn + r).transpose(1, 2)
        attn = ops.mla_attention_prefill(q, k, v).transpose(1, 2).reshape(b * t, nh * dv)
        return _mlp(ops, w, attn, flat).reshape(b, t, hidden), ckv, kpe

    def prefill(x, cos, sin):
        """x (B, T, hidden); cos and sin (T, rope_dim/2). Causal. Returns (out,)."""
        return expanded(x, None, None, cos, sin)[:1]

    def chunk(x, ckv_cache, kpe_cache, cos, sin):
        """x (B, T, hidden), a prompt's next T tokens; ckv_cache (B, L, kv_lora_rank) and
        kpe_cache (B, L, rope_dim) holding the prompt's L - T tokens before them and the
        chunk's T slots; cos and sin (T, rope_dim/2) at positions L - T to L - 1. Returns
        (out (B, T, hidden), ckv_new (B, T, kv_lora_rank), kpe_new (B, T, rope_dim))."""
        return expanded(x, ckv_cache, kpe_cache, cos, sin)

    return Block(cfg, decode, prefill, chunk, ops.label)


def decoder_block(cfg: BlockConfig, weights: dict[str, torch.Tensor], ops: Ops) -> Block:
    """The block of `cfg`'s kind over `weights`, calling `ops`."""
    missing = sorted(set(weight_shapes(cfg)) - set(weights))
    if missing:
        raise ValueError(f"weights lack {', '.join(missing)} for a {cfg.kind} block")
    if isinstance(cfg, LlamaConfig):
        return _llama_block(cfg, weights, ops)
    return _mla_block(cfg, weights, ops)


def compiled_block(block: Block, backend: str = "inductor") -> Block:
    """torch.compile of `block`'s forward functions (specialised per shape), compiled on first
    call; a tuned block's kernels stay opaque ops inside the compiled graph."""

    def compiled(fn: Callable) -> Callable:
        return torch.compile(fn, dynamic=False, backend=backend)

    return Block(
        block.cfg,
        compiled(block.decode),
        compiled(block.prefill),
        compiled(block.chunk),
        f"compiled {block.label}" if block.label != "eager" else "compiled",
    )


def stacked_block(blocks: list[Block]) -> Block:
    """Blocks run in sequence, as a model's layers are: each with its own weights and, at
    decode and in a chunked prefill, its own caches (`make_inputs(..., layers=len(blocks))`
    stacks them on a leading layer dim). `decode` and `chunk` return the last output and every
    layer's new cache entries."""

    def over_caches(step: str) -> Callable:
        def run(x, caches_a, caches_b, cos, sin):
            new = []
            for i, block in enumerate(blocks):
                x, a, b = getattr(block, step)(x, caches_a[i], caches_b[i], cos, sin)
                new += [a, b]
            return (x, *new)

        return run

    def prefill(x, cos, sin):
        for block in blocks:
            (x,) = block.prefill(x, cos, sin)
        return (x,)

    return Block(
        blocks[0].cfg, over_caches("decode"), prefill, over_caches("chunk"), blocks[0].label
    )


# ---------------------------------------------------------------------------------- inputs


def rope_tables(cfg: BlockConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin of shape (len(positions), rotary_dim / 2)."""
    dim = cfg.head_dim if isinstance(cfg, LlamaConfig) else cfg.rope_dim
    half = dim // 2
    inv = cfg.theta ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
    angles = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()


MODES = ("decode", "prefill", "chunk")


def make_inputs(
    cfg: BlockConfig,
    mode: str,
    batch: int,
    length: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    layers: int | None = None,
    tokens: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """Inputs of `Block.decode` (mode "decode", `length` = context, the new token at position
    length - 1), `Block.prefill` (mode "prefill", `length` = tokens) or `Block.chunk` (mode
    "chunk": the last `tokens` of a `length`-token prompt), in the device's dtype;
    with `layers`, of a `stacked_block` of that many (the caches on a leading layer dim).
    Activations and caches ~ N(0, 1)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if (mode == "chunk") != (tokens is not None):
        raise ValueError(f"tokens is given with mode 'chunk' only (mode {mode!r}, tokens {tokens})")
    for name, value in (
        ("batch", batch),
        ("length", length),
        ("layers", 1 if layers is None else layers),
        ("tokens", 1 if tokens is None else tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if tokens is not None and tokens > length:
        raise ValueError(f"a chunk of {tokens} tokens is longer than its prompt ({length})")
    stack = () if layers is None else (layers,)
    dtype = default_dtype(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    if mode == "prefill":
        cos, sin = rope_tables(cfg, torch.arange(length, device=device))
        return draw(batch, length, cfg.hidden), cos, sin
    if mode == "chunk":
        cos, sin = rope_tables(cfg, torch.arange(length - tokens, length, device=device))
        x = draw(batch, tokens, cfg.hidden)
    else:
        cos, sin = rope_tables(cfg, torch.full((batch,), length - 1, device=device))
        x = draw(batch, cfg.hidden)
    if isinstance(cfg, LlamaConfig):
        shape = (*stack, batch, cfg.kv_heads, length, cfg.head_dim)
        return x, draw(*shape), draw(*shape), cos, sin
    ckv, kpe = (
        draw(*stack, batch, length, cfg.kv_lora_rank),
        draw(*stack, batch, length, cfg.rope_dim),
    )
    return x, ckv, kpe, cos, sin

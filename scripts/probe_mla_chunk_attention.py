"""Why SDPA takes the backend it does inside the DeepSeek-like block's chunked prefill: the
layouts of the q, k and v the block hands its expanded attention, whether SDPA's
memory-efficient backend takes them (and, on a GPU, its reasons where not), and the peak memory
of one eager chunk. Session 32's chunks ran out of memory in CUDA-graph pools the size of the
scores materialised (2026-12-01-h200-session32.md).

    uv run python scripts/probe_mla_chunk_attention.py --length 32768 --tokens 4096 [--json out.json]

On a machine without a GPU it runs a tiny config on the CPU (layouts only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from loop.blocks import MlaConfig, decoder_block, eager_ops, make_inputs, make_weights

TINY = MlaConfig(hidden=64, heads=2, q_lora_rank=32, kv_lora_rank=32, ffn=64)


def _efficient_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[bool, list]:
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = can_use_efficient_attention(SDPAParams(q, k, v, None, 0.0, False, False), True)
    return ok, [str(w.message) for w in caught]


def probe(length: int, tokens: int, device: str) -> dict:
    """One eager chunk of `tokens` at the end of a `length`-token prompt, its attention's
    inputs recorded."""
    cfg = MlaConfig() if device == "cuda" else TINY
    eager = eager_ops()
    seen: dict = {}

    def recording(q, k, v):
        seen.update(
            {
                name: {"dtype": str(t.dtype), "shape": list(t.shape), "stride": list(t.stride())}
                for name, t in (("q", q), ("k", k), ("v", v))
            }
        )
        if device == "cuda":
            seen["efficient"], seen["efficient_refused_because"] = _efficient_reasons(q, k, v)
        return eager.mla_attention_prefill(q, k, v)

    block = decoder_block(
        cfg,
        make_weights(cfg, device, seed=0),
        dataclasses.replace(eager, mla_attention_prefill=recording),
    )
    inputs = make_inputs(cfg, "chunk", 1, length, device=device, seed=1, tokens=tokens)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with torch.no_grad():
        block.chunk(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
        seen["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=32768, help="prompt tokens [32768]")
    parser.add_argument("--tokens", type=int, default=4096, help="chunk tokens [4096]")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        args.length, args.tokens = min(args.length, 64), min(args.tokens, 16)
    result = {"device": device, "length": args.length, "tokens": args.tokens}
    result.update(probe(args.length, args.tokens, device))
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

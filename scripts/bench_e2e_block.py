"""Do tuned kernels compound? A whole decoder block (Llama-like, and DeepSeek-like with MLA) at
decode and prefill sizes and at a chunk of a long prompt's prefill, timed under CUDA
graphs: eager ops, torch.compile of the eager block, the tuned ops the dispatch tables of an
`autotune run` directory (or of scripts/dispatch_from_bench.py) pick, and torch.compile of that
tuned block (GPU only).

    uv run python scripts/bench_e2e_block.py --dispatch-dir out --json e2e-block.json

For every size: each variant's relative error against the block in float32 (the bf16 block's
weights and inputs upcast) and that of a CUDA graph replay against a direct call (each judged
against eager's own, `verdicts`), then the four
variants interleaved (baselines.timer, several captures per variant, rotated block by block as
the evaluator does; 2 where 8 run out of memory), with median intervals and the paired speedups
against eager and compiled. Decode sizes also report the bytes a step must stream (weights + KV
cache) per second, as a % of an SM copy kernel and of an SM read kernel measured in the same
run, and with --profile each kernel of a replay and the idle gaps between them. The decode
target is 90 % of copy bandwidth.

A size is mode:batch:length, or chunk:batch:length:tokens for the last `tokens` of a
`length`-token prompt prefilled onto the cache of the tokens before them, e.g. --kinds llama
--sizes chunk:1:131072:8192, the prefill_attention task's chunked shape, or --kinds mla --sizes
chunk:1:32768:4096, one of the mla_prefill_attention task's (DeepSeek's block attends in the
expanded form, every head's key and value made from the latent cache).

With --layers N, each graph runs N blocks in sequence, each with its own weights and caches, as
a model's decode step does: the graph's launch and its events (about 4 us, the timer's floor)
are paid once per N blocks, and a kernel may overlap the last one of the block before it.

With --also NAME=DIR (repeatable), the tables in DIR give two more variants, tuned:NAME and
compiled-tuned:NAME, timed interleaved with the others: an A/B of tables (one of
scripts/dispatch_variant.py, say) against the same eager and compiled blocks in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from baselines.graph_profile import format_timeline, kernel_timeline
from baselines.roofline import device_copy_bandwidth, device_read_bandwidth
from baselines.stats import ratio_interval, summarize
from baselines.timer import CAPTURE_SLOTS, GpuTimer, StoppingRule, measure_interleaved
from loop.blocks import (
    MODES,
    LlamaConfig,
    MlaConfig,
    bytes_streamed,
    compiled_block,
    decoder_block,
    eager_ops,
    make_inputs,
    make_weights,
    stacked_block,
    tuned_ops,
)

# (mode, batch, length, chunk tokens): decode at batch 1 and 16 and contexts 4k and 32k; a
# 4k-token prefill.
SIZES = [
    ("decode", 1, 4096, None),
    ("decode", 16, 4096, None),
    ("decode", 1, 32768, None),
    ("decode", 16, 32768, None),
    ("prefill", 1, 4096, None),
]
KINDS = {"llama": LlamaConfig, "mla": MlaConfig}
# tuned: the eager block with the dispatch tables' winning kernels swapped in; compiled-tuned:
# torch.compile of that block, the kernels opaque ops inside it (where a peer won, the op is
# compiled as in `compiled`).
VARIANTS = ("eager", "compiled", "tuned", "compiled-tuned")
# With --profile, the decode sizes' kernel timelines of these variants (and of each --also
# table's compiled-tuned block).
PROFILED = ("compiled", "compiled-tuned")
# Allowed relative error against the float32 block, over and above eager's own.
TOLERANCE = 2e-2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _let_compile_specialise() -> None:
    """One compilation per size: past dynamo's recompile limit it would silently run eager."""
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), 64))


def _enable_inductor_pdl() -> bool:
    """Have inductor launch its Triton kernels with programmatic dependent launch (each waits for
    the kernel before it where it reads what that kernel wrote); False where it cannot."""
    import torch._inductor.config as inductor

    if not hasattr(inductor.triton, "enable_pdl"):
        return False
    inductor.triton.enable_pdl = True
    return True


def _errors(cfg, weights: list[dict], blocks: dict, mode: str, inputs: tuple) -> dict:
    """Each variant's largest relative error over the outputs, against the layers in float32."""
    w32 = [{k: v.float() for k, v in layer.items()} for layer in weights]
    ref_block = stacked_block([decoder_block(cfg, w, eager_ops()) for w in w32])
    ref = getattr(ref_block, mode)(*(t.float() for t in inputs))
    out = {}
    for label, block in blocks.items():
        got = getattr(block, mode)(*inputs)
        out[label] = max(_rel(g, r) for g, r in zip(got, ref, strict=True))
    del ref, w32
    return out


def verdicts(errors: dict[str, float], replay: dict[str, float]) -> dict[str, bool]:
    """Whether each variant is right: its error against the float32 block within TOLERANCE of
    eager's own, and its graph replay within TOLERANCE of its direct call, over and above what
    eager's replay differs by (cuBLAS may pick other algorithms under capture, and many layers
    carry the difference; a kernel that reads its input before the kernel writing it is done
    leaves a replay far off, or NaN, which fails every comparison)."""
    limit = errors["eager"] + TOLERANCE
    replay_limit = replay["eager"] + TOLERANCE
    return {v: errors[v] <= limit and replay[v] <= replay_limit for v in errors}


def _replay_error(timer: GpuTimer, fn, inputs: tuple) -> float:
    """The largest relative error of a captured graph's replay against a direct call: where a
    kernel launched with programmatic dependent launch read an input before the kernel that
    writes it was done, the replay differs."""
    direct = fn(*inputs)
    graph, out = timer.capture(lambda: fn(*inputs))
    for t in out:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    error = max(_rel(o, d) for o, d in zip(out, direct, strict=True))
    del graph, out, direct
    return error


def _runner(timer: GpuTimer, fn, inputs: tuple, slots: int, keep: list):
    graphs = [timer.capture(lambda: fn(*inputs))[0] for _ in range(slots)]
    keep.extend(graphs)
    turn = [0]

    def block(n: int) -> list[float]:
        turn[0] += 1
        return timer.block(graphs[turn[0] % len(graphs)], n)

    return block


def _timeline(timer: GpuTimer, fn, inputs: tuple):
    graph = timer.capture(lambda: fn(*inputs))[0]
    return kernel_timeline(graph, replays=20)


def parse_also(values: list[str]) -> list[tuple[str, Path]]:
    """--also NAME=DIR values as (name, folder); raises ValueError naming the bad one."""
    out: list[tuple[str, Path]] = []
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder or ":" in name:
            raise ValueError(f"--also {value!r}: expected NAME=DIR, NAME without ':'")
        if name in {n for n, _ in out}:
            raise ValueError(f"--also {value!r}: the name {name!r} is given twice")
        path = Path(folder)
        if not any(path.glob("dispatch-*.json")):
            raise ValueError(f"--also {value!r}: no dispatch-<task>.json in {path}")
        out.append((name, path))
    return out


def _ratio(medians: list[list[float]], base: int, other: int) -> dict:
    """median(base) / median(other): above 1, `other` is faster."""
    return ratio_interval(medians[base], medians[other]).to_dict()


def parse_sizes(value: str) -> list[tuple[str, int, int, int | None]]:
    """--sizes as (mode, batch, length, chunk tokens or None); raises ValueError naming the bad
    size."""
    if value == "all":
        return list(SIZES)
    sizes = []
    for size in value.split(","):
        parts = size.strip().split(":")
        mode = parts[0]
        digits = all(p.isascii() and p.isdigit() for p in parts[1:])
        if len(parts) != (4 if mode == "chunk" else 3) or not digits:
            raise ValueError(
                f"--sizes: {size!r}: expected mode:batch:length (decode, prefill) or "
                "chunk:batch:length:tokens"
            )
        if mode not in MODES:
            raise ValueError(f"--sizes: {size!r}: mode must be one of {MODES}")
        numbers = [int(p) for p in parts[1:]]
        if 0 in numbers or (mode == "chunk" and numbers[2] > numbers[1]):
            raise ValueError(f"--sizes: {size!r}: positive numbers, a chunk no longer than length")
        sizes.append((mode, numbers[0], numbers[1], numbers[2] if mode == "chunk" else None))
    return sizes


def size_label(kind: str, mode: str, batch: int, length: int, tokens: int | None) -> str:
    return f"{kind} {mode} b{batch} L{length}" + (f" T{tokens}" if tokens else "")


def bench_size(args, cfg, weights, blocks, timer, size, bw, captures) -> dict:
    mode, batch, length, tokens = size
    layers = len(weights)
    inputs = make_inputs(
        cfg, mode, batch, length, device="cuda", seed=1, layers=layers, tokens=tokens
    )
    row: dict = {"kind": cfg.kind, "mode": mode, "batch": batch, "length": length}
    if tokens is not None:
        row["tokens"] = tokens
    row["layers"] = layers
    row["captures"] = captures
    t0 = time.perf_counter()
    errors = _errors(cfg, weights, blocks, mode, inputs)
    row["rel_error_vs_fp32"] = errors
    row["check_s"] = time.perf_counter() - t0
    variants = list(blocks)
    replay = {v: _replay_error(timer, getattr(blocks[v], mode), inputs) for v in variants}
    row["replay_rel_error"] = replay
    row["correct"] = verdicts(errors, replay)
    keep: list = []
    runners = [_runner(timer, getattr(blocks[v], mode), inputs, captures, keep) for v in variants]
    rule = StoppingRule(
        min_blocks=args.min_blocks,
        max_time_s=args.max_time_s,
        ratio_halfwidth=args.ratio_halfwidth,
        min_block_s=0.002,
    )
    result = measure_interleaved(runners, rule)
    med = result.medians
    row["times_s"] = {v: summarize(med[i]).to_dict() for i, v in enumerate(variants)}
    at = {v: i for i, v in enumerate(variants)}
    row["tuned_vs_eager"] = _ratio(med, at["eager"], at["tuned"])
    row["tuned_vs_compiled"] = _ratio(med, at["compiled"], at["tuned"])
    row["compiled_vs_eager"] = _ratio(med, at["eager"], at["compiled"])
    row["compiled_tuned_vs_compiled"] = _ratio(med, at["compiled"], at["compiled-tuned"])
    row["compiled_tuned_vs_eager"] = _ratio(med, at["eager"], at["compiled-tuned"])
    # each --also table against the main one, variant for variant: above 1, NAME's is faster
    names = [v.partition(":")[2] for v in variants if v.startswith("tuned:")]
    row["also"] = {
        name: {
            "tuned": _ratio(med, at["tuned"], at[f"tuned:{name}"]),
            "compiled_tuned": _ratio(med, at["compiled-tuned"], at[f"compiled-tuned:{name}"]),
        }
        for name in names
    }
    row["blocks"] = result.blocks
    row["samples_per_block"] = result.samples_per_block
    row["stop_reason"] = result.stop_reason
    if mode == "decode":
        nbytes = layers * bytes_streamed(cfg, batch, length, itemsize=2)
        row["bytes_streamed"] = nbytes
        row["stream_pct_of_copy"] = {
            v: 100 * nbytes / row["times_s"][v]["median"] / bw["copy"] for v in variants
        }
        row["stream_pct_of_read"] = {
            v: 100 * nbytes / row["times_s"][v]["median"] / bw["read"] for v in variants
        }
    if args.profile and mode == "decode":
        row["timeline"] = {}
        for v in [*PROFILED, *(v for v in variants if v.startswith("compiled-tuned:"))]:
            try:
                timeline = _timeline(timer, getattr(blocks[v], mode), inputs)
            except Exception as exc:  # no profiler, or a trace it cannot cut: keep the timings
                row["timeline"][v] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            row["timeline"][v] = timeline.to_dict()
            print(f"{size_label(cfg.kind, *size)} {v}:\n{format_timeline(timeline)}")
    del keep, runners, inputs
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _record_notes(doc: dict, ops, also_ops: dict) -> None:
    """What each table chose for each call (the main one's, and each --also one's)."""
    doc["tuned_notes"] = list(dict.fromkeys(ops.notes))
    if also_ops:
        doc["also_notes"] = {n: list(dict.fromkeys(o.notes)) for n, o in also_ops.items()}


def _print_row(row: dict) -> None:
    t = row["times_s"]
    head = f"{row['kind']:5s} {row['mode']:7s} b{row['batch']:<3d} L{row['length']:<6d}"
    head += f" T{row['tokens']}" if "tokens" in row else ""
    head += f" x{row['layers']} layers" if row["layers"] > 1 else ""
    us = "  ".join(f"{v} {t[v]['median'] * 1e6:9.1f} us" for v in t)
    te, tc = row["tuned_vs_eager"], row["tuned_vs_compiled"]
    ct = row["compiled_tuned_vs_compiled"]
    line = (
        f"{head} {us}  tuned/eager x{te['ratio']:.3f} [{te['ci_low']:.3f}, {te['ci_high']:.3f}]"
        f"  tuned/compiled x{tc['ratio']:.3f} [{tc['ci_low']:.3f}, {tc['ci_high']:.3f}]"
        f"  compiled-tuned/compiled x{ct['ratio']:.3f} [{ct['ci_low']:.3f}, {ct['ci_high']:.3f}]"
    )
    for name, r in row.get("also", {}).items():
        ab = r["compiled_tuned"]
        line += f"  {name}/main compiled-tuned x{ab['ratio']:.3f}"
        line += f" [{ab['ci_low']:.3f}, {ab['ci_high']:.3f}]"
    if "stream_pct_of_copy" in row:
        pct = row["stream_pct_of_copy"]
        line += "  stream % copy: " + " ".join(f"{v} {p:.1f}" for v, p in pct.items())
    bad = [v for v, ok in row["correct"].items() if not ok]
    errs = " ".join(f"{v} {e:.2e}" for v, e in row["rel_error_vs_fp32"].items())
    errs += "  replay " + " ".join(f"{v} {e:.1e}" for v, e in row["replay_rel_error"].items())
    line += f"  err {errs}" + (f"  WRONG: {', '.join(bad)}" if bad else "")
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dispatch-dir",
        type=Path,
        default=Path("out"),
        help="run directory of `autotune run` holding dispatch-<task>.json [default: out]",
    )
    parser.add_argument("--kinds", default="llama,mla", help="comma list of llama, mla")
    parser.add_argument(
        "--sizes",
        default="all",
        help="comma list of mode:batch:length (e.g. decode:1:4096,prefill:1:4096), "
        "chunk:batch:length:tokens (a prompt's last tokens onto its cache), or all",
    )
    parser.add_argument("--json", type=Path, default=Path("e2e-block.json"))
    parser.add_argument("--captures", type=int, default=CAPTURE_SLOTS)
    parser.add_argument("--min-blocks", type=int, default=10)
    parser.add_argument("--max-time-s", type=float, default=3.0)
    parser.add_argument("--ratio-halfwidth", type=float, default=0.005)
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"at decode sizes, also each kernel's time and the gaps ({', '.join(PROFILED)})",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=1,
        help="blocks in sequence in each graph, each with its own weights and caches, as a "
        "model's layers run in one decode step's graph [default: 1]",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="more tables to time in the same run, as variants tuned:NAME and "
        "compiled-tuned:NAME (repeatable)",
    )
    parser.add_argument(
        "--inductor-pdl",
        action="store_true",
        help="torch.compile's own kernels, in both compiled variants, launched with "
        "programmatic dependent launch (torch._inductor.config.triton.enable_pdl)",
    )
    args = parser.parse_args(argv)

    if args.layers < 1:
        print(f"--layers: must be at least 1, got {args.layers}", file=sys.stderr)
        return 2
    try:
        also = parse_also(args.also)
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_e2e_block: needs a CUDA GPU", file=sys.stderr)
        return 2
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        print(f"--kinds: unknown {unknown}; known: {sorted(KINDS)}", file=sys.stderr)
        return 2

    if args.inductor_pdl and not _enable_inductor_pdl():
        print(
            f"--inductor-pdl: torch {torch.__version__}'s inductor has no enable_pdl",
            file=sys.stderr,
        )
        return 2
    _let_compile_specialise()
    torch.manual_seed(0)
    timer = GpuTimer("cuda")
    bw = {"copy": device_copy_bandwidth(timer), "read": device_read_bandwidth(timer)}
    print(
        f"{torch.cuda.get_device_name()}: SM copy {bw['copy'] / 1e12:.2f} TB/s, "
        f"read {bw['read'] / 1e12:.2f} TB/s",
        flush=True,
    )
    ops = tuned_ops(args.dispatch_dir, "cuda")
    also_ops = {name: tuned_ops(folder, "cuda") for name, folder in also}
    doc: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dispatch_dir": str(args.dispatch_dir),
        "also": {name: str(folder) for name, folder in also},
        "inductor_pdl": args.inductor_pdl,
        "copy_bytes_per_s": bw["copy"],
        "read_bytes_per_s": bw["read"],
        "decode_target_pct_of_copy": 90.0,
        "results": [],
        "errors": [],
        "failed": [],
    }
    for kind in kinds:
        cfg = KINDS[kind]()
        weights = [make_weights(cfg, "cuda", seed=i) for i in range(args.layers)]
        eager = stacked_block([decoder_block(cfg, w, eager_ops()) for w in weights])
        tuned = stacked_block([decoder_block(cfg, w, ops) for w in weights])
        base = (eager, compiled_block(eager), tuned, compiled_block(tuned))
        blocks = dict(zip(VARIANTS, base, strict=True))
        for name, other in also_ops.items():
            block = stacked_block([decoder_block(cfg, w, other) for w in weights])
            blocks[f"tuned:{name}"] = block
            blocks[f"compiled-tuned:{name}"] = compiled_block(block)
        for size in sizes:
            label = size_label(kind, *size)
            t0 = time.perf_counter()
            row = None
            # Each capture holds its own intermediates: at the largest sizes, fewer captures.
            for captures in dict.fromkeys((args.captures, min(args.captures, 2))):
                try:
                    row = bench_size(args, cfg, weights, blocks, timer, size, bw, captures)
                    break
                except Exception as exc:  # one size failing (memory, capture) keeps the others
                    msg = f"{label} with {captures} captures: "
                    msg = f"{msg}{type(exc).__name__}: {exc}"[:600]
                    print(f"FAILED {msg}", flush=True)
                    doc["errors"].append(msg)
                # out of the handler: its traceback holds the failed size's graphs and inputs
                gc.collect()
                torch.cuda.empty_cache()
            if row is None:
                doc["failed"].append(label)
                continue
            row["wall_s"] = time.perf_counter() - t0
            doc["results"].append(row)
            _print_row(row)
            _record_notes(doc, ops, also_ops)
            args.json.write_text(json.dumps(doc, indent=1))
        del weights, eager, tuned, blocks
        gc.collect()
        torch.cuda.empty_cache()
    _record_notes(doc, ops, also_ops)
    args.json.write_text(json.dumps(doc, indent=1))
    print("tuned ops:", *doc["tuned_notes"], sep="\n  ")
    print(f"wrote {args.json}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

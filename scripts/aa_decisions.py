"""GPU benchmark of the decision procedure (issue 4's calibration figures): the timing engine
and statistics of `baselines/`, driven the way the evaluator drives them, with the default
StoppingRule and GpuTimer (their settings go into the output).

1. A/A: N decisions of the RMSNorm Triton kernel against itself at 32768 x 4096 (two graphs,
   same inputs), 0.5 % minimum effect: counts of each verdict, interval half-widths, cost.
2. Power: M decisions of that kernel against the same kernel over 1 % more rows.
3. Truth: one long, tight measurement of what "1 % more rows" really costs (the decision can
   only find the effect that is there), for every L2 flush mode asked for.
4. Flush check: a small kernel (inputs fit in L2) hot and after each flush mode; a flush that
   does not evict shows the hot time.
5. Bias: a few A/A decisions at every GPU shape of the task.

    python scripts/aa_decisions.py OUT.json [--aa 200] [--slow 100] [--extra-rows-pct 1]
        [--flush read --compare-flush write,write_read --compare-decisions 50]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections import Counter
from dataclasses import asdict, replace

import torch

from baselines.stats import decide, ratio_interval
from baselines.timer import (
    CAPTURE_SLOTS,
    FLUSH_MODES,
    GpuTimer,
    StoppingRule,
    measure_interleaved,
    median,
)
from loop.tasks import load_task

MIN_EFFECT = 0.005
PARAMS = {"num_warps": 4, "rows_per_program": 1, "x_eviction": "", "chunk": 0}
ROWS, COLS = 32768, 4096
TRUTH_RULE = replace(
    StoppingRule(), max_blocks=100_000, max_time_s=6.0, ratio_halfwidth=0.0002, min_blocks=50
)


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runner(timer: GpuTimer, fn, slots: int):
    """A block function over `slots` captures of `fn` (each with its own output buffers), one
    capture per block in turn, so no decision rests on where one capture's outputs landed."""
    graphs = [timer.capture(fn)[0] for _ in range(slots)]
    return timer.rotating(graphs), graphs


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _decisions(timer: GpuTimer, fn_a, fn_b, count: int, rule: StoppingRule, slots: int) -> dict:
    """`count` decisions, each on fresh captures (as each evaluation captures its own)."""
    verdicts, widths, ratios, seconds = Counter(), [], [], []
    blocks, samples, reasons = [], [], Counter()
    for _ in range(count):
        (a, ga), (b, gb) = _runner(timer, fn_a, slots), _runner(timer, fn_b, slots)
        start = time.perf_counter()
        result = measure_interleaved([a, b], rule)
        interval = ratio_interval(*result.medians)
        verdict = decide(interval, MIN_EFFECT)
        seconds.append(time.perf_counter() - start)
        del ga, gb
        verdicts[verdict] += 1
        ratios.append(interval.ratio)
        widths.append((interval.ci_high - interval.ci_low) / 2 / interval.ratio)
        blocks.append(result.blocks)
        samples.append(result.samples_per_block)
        reasons[result.stop_reason] += 1
    for xs in (seconds, widths, ratios, blocks):
        xs.sort()
    return {
        "decisions": count,
        "verdicts": dict(verdicts),
        "false_rate": (verdicts["faster"] + verdicts["slower"]) / count,
        "median_ratio": _pct(ratios, 0.5),
        "ratio_p05_p95": [_pct(ratios, 0.05), _pct(ratios, 0.95)],
        "median_rel_halfwidth": _pct(widths, 0.5),
        "p90_rel_halfwidth": _pct(widths, 0.9),
        "median_seconds": _pct(seconds, 0.5),
        "p95_seconds": _pct(seconds, 0.95),
        "max_seconds": seconds[-1],
        "median_blocks": _pct(blocks, 0.5),
        "samples_per_block": sorted(set(samples)),
        "stop_reasons": dict(reasons),
    }


def _truth(timer: GpuTimer, fn_a, fn_b, slots: int) -> dict:
    (a, ga), (b, gb) = _runner(timer, fn_a, slots), _runner(timer, fn_b, slots)
    result = measure_interleaved([a, b], TRUTH_RULE)
    interval = ratio_interval(*result.medians)
    del ga, gb
    return {
        "b_over_a_time": 1 / interval.ratio,
        "ci": [1 / interval.ci_high, 1 / interval.ci_low],
        "a_median_us": median(result.medians[0]) * 1e6,
        "b_median_us": median(result.medians[1]) * 1e6,
        "blocks": result.blocks,
        "samples_per_block": result.samples_per_block,
        "seconds": result.seconds,
    }


def _flush_check(device: str) -> dict:
    """Median time of a copy whose 8 MiB of inputs fit in L2: hot (no flush) and per mode."""
    src = torch.randn(2 * 2**20, device=device)
    dst = torch.empty_like(src)
    out = {}
    for mode in FLUSH_MODES:
        timer = GpuTimer(device, flush=mode)
        run, graph = _runner(timer, lambda: torch.mul(src, 1.0, out=dst), 1)
        run(50)
        out[mode] = median([median(run(100)) for _ in range(5)]) * 1e6
        del graph
    return {"copy_8MiB_median_us": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--aa", type=int, default=200, help="A/A decisions")
    ap.add_argument("--slow", type=int, default=100, help="decisions against the slower kernel")
    ap.add_argument("--extra-rows-pct", type=float, default=1.0)
    ap.add_argument("--flush", default="read", choices=FLUSH_MODES, help="flush of the main run")
    ap.add_argument(
        "--compare-flush",
        default="write",
        help="comma-separated other flush modes: truth + --compare-decisions power decisions",
    )
    ap.add_argument("--compare-decisions", type=int, default=50)
    ap.add_argument("--bias-decisions", type=int, default=3)
    ap.add_argument(
        "--slots", type=int, default=CAPTURE_SLOTS, help="captures per kernel, one per block"
    )
    ap.add_argument(
        "--compare-slots",
        type=int,
        default=1,
        help="also the power decisions with this many captures (0: skip)",
    )
    ap.add_argument(
        "--rule", default="{}", help='JSON overrides of StoppingRule, e.g. {"min_blocks": 20}'
    )
    args = ap.parse_args()
    others = [m for m in args.compare_flush.split(",") if m]
    for mode in others:
        if mode not in FLUSH_MODES:
            ap.error(f"--compare-flush: {mode!r} is not one of {FLUSH_MODES}")
    rule = StoppingRule(**json.loads(args.rule))

    task = load_task("rmsnorm")
    kernel = _load(task.folder / "triton_rmsnorm.py").kernel
    gen = torch.Generator(device="cuda").manual_seed(5)
    extra = round(ROWS * args.extra_rows_pct / 100)
    x = torch.randn(ROWS + extra, COLS, device="cuda", generator=gen).to(torch.bfloat16)
    w = (1 + 0.25 * torch.randn(COLS, device="cuda", generator=gen)).to(torch.bfloat16)
    base = x[:ROWS]

    def fn_base():
        return kernel(base, w, **PARAMS)

    def fn_more():
        return kernel(x, w, **PARAMS)

    timer = GpuTimer("cuda", flush=args.flush)
    result = {
        "device": torch.cuda.get_device_name(),
        "params": PARAMS,
        "shape": [ROWS, COLS],
        "extra_rows": extra,
        "min_effect": MIN_EFFECT,
        "rule": asdict(rule),
        "timer": {"flush": timer.flush_mode, "l2_bytes": timer.l2_bytes},
    }
    print("rule", result["rule"], "timer", result["timer"], flush=True)
    result["flush_check"] = _flush_check("cuda")
    print("flush check", result["flush_check"], flush=True)
    result["slots"] = args.slots
    result["aa"] = _decisions(timer, fn_base, fn_base, args.aa, rule, args.slots)
    print("A/A", result["aa"], flush=True)
    # ratio_interval(a, b) is a's time over b's: the longer B reads as "slower" below 1.
    result["more_rows"] = _decisions(timer, fn_base, fn_more, args.slow, rule, args.slots)
    print(f"{args.extra_rows_pct}% more rows", result["more_rows"], flush=True)
    if args.compare_slots and args.compare_slots != args.slots:
        result["more_rows_other_slots"] = {
            "slots": args.compare_slots,
            **_decisions(timer, fn_base, fn_more, args.slow, rule, args.compare_slots),
        }
        print(f"more rows, {args.compare_slots} slot(s)", result["more_rows_other_slots"])
    result["truth"] = {args.flush: _truth(timer, fn_base, fn_more, args.slots)}
    print("truth", args.flush, result["truth"][args.flush], flush=True)
    result["compare_flush"] = {}
    for mode in others:
        other = GpuTimer("cuda", flush=mode)
        result["truth"][mode] = _truth(other, fn_base, fn_more, args.slots)
        print("truth", mode, result["truth"][mode], flush=True)
        if args.compare_decisions:
            result["compare_flush"][mode] = _decisions(
                other, fn_base, fn_more, args.compare_decisions, rule, args.slots
            )
            print("more rows,", mode, result["compare_flush"][mode], flush=True)
        del other
    bias = {}
    for shape in task.shapes("cuda") if args.bias_decisions > 0 else []:
        xs, ws = task.make_inputs(shape, shape.seed, "cuda")
        bias[shape.name] = _decisions(
            timer,
            lambda a=xs, b=ws: kernel(a, b, **PARAMS),
            lambda a=xs, b=ws: kernel(a, b, **PARAMS),
            args.bias_decisions,
            rule,
            args.slots,
        )
        print(shape.name, bias[shape.name], flush=True)
        del xs, ws
    result["aa_by_shape"] = bias
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()

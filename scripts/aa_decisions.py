"""GPU benchmark of the decision procedure (issue 4's calibration figures): the timing engine
and statistics of `baselines/`, driven the way the evaluator drives them.

1. A/A: N decisions of the RMSNorm Triton kernel against itself at 32768 x 4096 (two graphs,
   same inputs), default stopping rule, 0.5 % minimum effect: counts of each verdict.
2. Power: M decisions of that kernel against the same kernel over 1 % more rows.
3. Cost: seconds per decision.
4. Bias: one A/A decision at every GPU shape of the task (ratio and interval).

    python scripts/aa_decisions.py OUT.json [N] [M]
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import torch

from baselines.stats import decide, ratio_interval
from baselines.timer import GpuTimer, StoppingRule, run_interleaved
from loop.tasks import load_task

MIN_EFFECT = 0.005
PARAMS = {"num_warps": 4, "rows_per_program": 1, "x_eviction": "", "chunk": 0}


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(timer, fn):
    graph, _ = timer.capture(fn)
    return lambda n: timer.block(graph, n)


def _decisions(timer, fn_a, fn_b, count: int) -> dict:
    a, b = _blocks(timer, fn_a), _blocks(timer, fn_b)
    verdicts, widths, ratios, seconds = Counter(), [], [], []
    for _ in range(count):
        start = time.perf_counter()
        blocks_a, blocks_b = run_interleaved([a, b], StoppingRule())
        interval = ratio_interval(blocks_a, blocks_b)
        seconds.append(time.perf_counter() - start)
        verdicts[decide(interval, MIN_EFFECT)] += 1
        ratios.append(interval.ratio)
        widths.append((interval.ci_high - interval.ci_low) / 2)
    seconds.sort()
    return {
        "decisions": count,
        "verdicts": dict(verdicts),
        "median_ratio": sorted(ratios)[count // 2],
        "median_halfwidth": sorted(widths)[count // 2],
        "median_seconds": seconds[count // 2],
        "max_seconds": seconds[-1],
    }


def main() -> None:
    out = sys.argv[1]
    n_aa = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    n_slow = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    task = load_task("rmsnorm")
    kernel = _load(task.folder / "triton_rmsnorm.py").kernel
    timer = GpuTimer("cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(33096, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    w = (1 + 0.25 * torch.randn(4096, device="cuda", generator=gen)).to(torch.bfloat16)
    base = x[:32768]
    result = {"params": PARAMS, "min_effect": MIN_EFFECT, "rule": StoppingRule().__dict__}
    result["aa"] = _decisions(
        timer, lambda: kernel(base, w, **PARAMS), lambda: kernel(base, w, **PARAMS), n_aa
    )
    print("A/A", result["aa"], flush=True)
    # ratio_interval(a, b) is a's time over b's: the longer B reads as "slower" below 1.
    result["one_percent_more_rows"] = _decisions(
        timer, lambda: kernel(base, w, **PARAMS), lambda: kernel(x, w, **PARAMS), n_slow
    )
    print("1% slower", result["one_percent_more_rows"], flush=True)
    bias = {}
    for shape in task.shapes("cuda"):
        xs, ws = task.make_inputs(shape, shape.seed, "cuda")
        bias[shape.name] = _decisions(
            timer,
            lambda a=xs, b=ws: kernel(a, b, **PARAMS),
            lambda a=xs, b=ws: kernel(a, b, **PARAMS),
            3,
        )
        print(shape.name, bias[shape.name], flush=True)
        del xs, ws
    result["aa_by_shape"] = bias
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()

"""Exploration on the GPU (not part of the product): time every configuration of the shipped
Triton RMSNorm at one shape with the harness's timer (CUDA-graph replay, L2 flushed), next to
the copy ceiling and the torch.compile peers (run with TORCH_LOGS=output_code to see inductor's
code). Prints one line per configuration and writes JSON to the path given first.

    python scripts/rmsnorm_sweep.py out.json [TOKENS HIDDEN]
"""

from __future__ import annotations

import itertools
import json
import sys

import torch

from baselines.roofline import device_copy_bandwidth
from baselines.timer import GpuTimer, median
from loop.tasks import load_task

EPS = 1e-6


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("triton_rmsnorm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eager(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def time_fn(timer, fn, x, w, ref):
    graph, out = timer.capture(lambda: fn(x, w))
    graph.replay()
    torch.cuda.synchronize()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if err > 8e-3:
        return None, err
    best = min(median(timer.block(graph, 20)) for _ in range(4))
    return best, err


def main() -> None:
    out_path = sys.argv[1]
    tokens, hidden = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (32768, 7168)
    timer = GpuTimer("cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    w = (1 + 0.25 * torch.randn(hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    ref = eager(x.double(), w.double()).double()
    nbytes = 2 * (2 * tokens * hidden + hidden)
    copy = device_copy_bandwidth(timer)
    print(f"copy ceiling {copy / 1e12:.3f} TB/s; shape {tokens}x{hidden}", flush=True)
    results = {"shape": [tokens, hidden], "copy_bytes_per_s": copy, "variants": {}}

    def record(name, fn):
        try:
            t, err = time_fn(timer, fn, x, w, ref)
        except Exception as exc:  # an invalid config (too many registers, ...) costs itself
            print(f"{name}: failed {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            return
        if t is None:
            print(f"{name}: WRONG relerr {err:.2e}", flush=True)
            return
        bw = nbytes / t
        results["variants"][name] = {"s": t, "bytes_per_s": bw, "of_copy": bw / copy}
        print(f"{name}: {t * 1e6:.1f} us {bw / 1e12:.3f} TB/s {100 * bw / copy:.1f}%", flush=True)

    static = torch.compile(eager, dynamic=False)
    record("torch.compile static", static)
    auto = torch.compile(eager)
    auto(x[:100].contiguous(), w)  # a second shape: default torch.compile goes dynamic
    record("torch.compile default after another shape", auto)
    record("torch.compile dynamic", torch.compile(eager, dynamic=True))
    candidate = _load(load_task("rmsnorm").folder / "triton_rmsnorm.py")
    space = candidate.PARAMS
    for values in itertools.product(*space.values()):
        params = dict(zip(space, values, strict=True))
        fn = lambda a, b, p=params: candidate.kernel(a, b, **p)  # noqa: E731
        record(json.dumps(params, separators=(",", ":")), fn)
    best = max(
        (k for k in results["variants"] if not k.startswith("torch")),
        key=lambda k: results["variants"][k]["bytes_per_s"],
    )
    results["best"] = best
    ranked = sorted(
        (k for k in results["variants"] if not k.startswith("torch")),
        key=lambda k: -results["variants"][k]["bytes_per_s"],
    )
    results["top"] = ranked[:3]
    print(f"best: {best} {results['variants'][best]}")
    with open(out_path, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()

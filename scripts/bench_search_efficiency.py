"""Search efficiency of the loop's parameter search, on the GPU.

For the RMSNorm and softmax Triton PARAMS spaces: time every configuration once through the
evaluator (verification, CUDA-graph timing, interleaved; the exhaustive optimum), then replay
those measurements to simulated searches: Optuna TPE through the loop's own `SearchProposer`
against random search (also through it, with Optuna's random sampler), over several seeds.
Reported: evaluations needed until the best configuration found is within 2 % of the optimum.

    uv run python scripts/bench_search_efficiency.py --out docs/benchmarks/search-efficiency.json
    # measure on the GPU only, simulate anywhere later:
    uv run python scripts/bench_search_efficiency.py --measure-only --out m.json
    uv run python scripts/bench_search_efficiency.py --from m.json --out result.json

The softmax space (15 552 configurations) is cut to the parameters its long-row path uses (block,
row_warps, num_stages; the rest at the kernel's defaults) so that every configuration can be
timed within about three minutes of GPU time; the RMSNorm space (64) is timed whole.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# task -> candidate, shapes timed, and the sub-space (None: the whole PARAMS space)
PLANS = {
    "rmsnorm": {
        "candidate": "triton_rmsnorm.py",
        "shapes": ["decode-16x7168", "long-32768x7168"],
        "space": None,
    },
    "softmax": {
        "candidate": "triton_softmax.py",
        "shapes": ["decode-64x128256", "prefill-2048x128256"],
        "space": ["block", "row_warps", "num_stages"],
    },
}
RULE = {"samples_per_block": 5, "min_blocks": 3, "max_blocks": 5, "max_time_s": 0.5}
WITHIN = 0.02
STRATEGIES = ("tpe", "random")


def configs_of(space: dict) -> list[dict]:
    names = list(space)
    return [dict(zip(names, v, strict=True)) for v in itertools.product(*space.values())]


def key_of(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def measure(task_name: str, plan: dict, chunk: int, device: str) -> dict:
    from loop.evaluator import CandidateSpec, Limits, evaluate, read_params_space
    from loop.tasks import load_task

    task = load_task(task_name)
    path = task.folder / plan["candidate"]
    full = read_params_space(path.read_text()) or {}
    space = full if plan["space"] is None else {k: full[k] for k in plan["space"]}
    known = {s.name: s.weight for s in task.shapes(device)}
    shapes = [s for s in plan["shapes"] if s in known] or list(known)[:2]
    weights = {s: known[s] for s in shapes}
    rows = []
    configs = configs_of(space)
    started = time.monotonic()
    for start in range(0, len(configs), chunk):
        part = configs[start : start + chunk]
        specs = [CandidateSpec(path, p, f"c{start + i}") for i, p in enumerate(part)]
        ev = evaluate(
            task,
            specs,
            device,
            time_it=True,
            shapes=shapes,
            rule=RULE,
            limits=Limits(timeout_s=400),
        )
        for spec in specs:
            v = ev.by_label(spec.label)
            medians = {n: s.median_s for n, s in v.shapes.items() if s.blocks_s}
            objective = None
            if v.accepted and set(medians) == set(shapes):
                total = sum(weights.values())
                objective = math.exp(sum(weights[n] * math.log(medians[n]) for n in shapes) / total)
            rows.append(
                {
                    "params": spec.params,
                    "accepted": v.accepted,
                    "reasons": [r.code for r in v.reasons],
                    "medians_s": medians,
                    "objective_s": objective,
                }
            )
        print(
            f"{task_name}: {len(rows)}/{len(configs)} configurations timed "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    return {
        "candidate": plan["candidate"],
        "space": space,
        "shapes": shapes,
        "weights": weights,
        "rule": RULE,
        "configs": rows,
        "measure_seconds": time.monotonic() - started,
    }


def simulate(measured: dict, seeds: int) -> dict:
    """Replay the measurements to the loop's SearchProposer with each sampler."""
    import optuna

    from loop.proposers import SearchProposer, make_sampler
    from loop.store import Ledger

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = measured["space"]
    table = {key_of(c["params"]): c["objective_s"] for c in measured["configs"]}
    good = [t for t in table.values() if t is not None]
    if not good:
        return {"error": "no configuration was accepted"}
    optimum = min(good)
    within = sum(1 for t in good if t <= optimum * (1 + WITHIN))
    reference = statistics.median(good)
    n = len(table)
    out = {
        "configurations": n,
        "accepted": len(good),
        "optimum_s": optimum,
        "optimum_params": json.loads(min((t, k) for k, t in table.items() if t is not None)[1]),
        "within_2pct": within,
        # drawing without replacement until one of `within` good ones: (n + 1) / (within + 1)
        "random_expected": (n + 1) / (within + 1),
        "strategies": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for kind in STRATEGIES:
            needed = []
            for seed in range(seeds):
                study = optuna.create_study(
                    direction="maximize", sampler=make_sampler(space, seed, kind)
                )
                ledger = Ledger(f"sqlite:///{tmp}/{kind}-{seed}.db", "bench")
                proposer = SearchProposer(study, Path("candidate.py"), space, "bench", ledger)
                count, best = 0, math.inf
                while (proposal := proposer.propose()) is not None:
                    count += 1
                    t = table.get(key_of(proposal.params))
                    if t is None:
                        study.tell(proposal.trial, state=optuna.trial.TrialState.FAIL)
                    else:
                        study.tell(proposal.trial, reference / t)
                        best = min(best, t)
                    if best <= optimum * (1 + WITHIN):
                        break
                needed.append(count)
            out["strategies"][kind] = {
                "evaluations": needed,
                "mean": statistics.mean(needed),
                "median": statistics.median(needed),
                "max": max(needed),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("search-efficiency.json"))
    parser.add_argument("--task", action="append", choices=sorted(PLANS), default=None)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=32, help="configurations per worker")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--measure-only", action="store_true")
    parser.add_argument("--from", dest="from_file", type=Path, default=None)
    args = parser.parse_args()
    tasks = args.task or list(PLANS)

    if args.from_file:
        doc = json.loads(args.from_file.read_text())
    else:
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            print("no CUDA device: run this on the GPU host (or --from a measurement)")
            return 2
        doc = {
            "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
            "torch": torch.__version__,
            "tasks": {
                t: {"measured": measure(t, PLANS[t], args.chunk, args.device)} for t in tasks
            },
        }
    if not args.measure_only:
        for name, entry in doc["tasks"].items():
            entry["search"] = simulate(entry["measured"], args.seeds)
            s = entry["search"]
            if "error" in s:
                print(f"{name}: {s['error']}")
                continue
            print(
                f"\n{name}: {s['configurations']} configurations, {s['accepted']} accepted, "
                f"{s['within_2pct']} within 2 % of the optimum {s['optimum_s'] * 1e6:.2f} us "
                f"{s['optimum_params']}"
            )
            print(f"  random search, expected: {s['random_expected']:.1f} evaluations")
            for kind, r in s["strategies"].items():
                print(
                    f"  {kind:6s} evaluations to within 2 %: mean {r['mean']:.1f}, median "
                    f"{r['median']:.1f}, max {r['max']} over {len(r['evaluations'])} seeds"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the evaluator costs on a GPU: seconds per `autotune verify rmsnorm triton_rmsnorm.py`,
cold (a fresh Triton cache) and warm, and how much of it is measurement.

    uv run python scripts/bench_evaluator_cost.py [--runs 3] [--out evaluator_cost.json]

Three views: the CLI's wall time (what a user waits for: interpreter, imports, worker, all
guards); the evaluator's own split (harness import, verification, timing) from `evaluate()`;
and for `bench` on one shape, the time spent inside measured samples against the whole.
Prints a summary and writes it all as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASK = "rmsnorm"
CANDIDATE = "triton_rmsnorm.py"
BENCH_SHAPE = "prefill-4096x4096"


def cli_seconds(command: list[str], env: dict) -> tuple[float, dict]:
    args = [sys.executable, "-m", "appliance", *command, "--device", "cuda", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout)


def in_process(runs: int) -> dict:
    from loop.evaluator import CandidateSpec, evaluate
    from loop.tasks import load_task

    task = load_task(TASK)
    spec = CandidateSpec(task.folder / CANDIDATE)
    verify = []
    for _ in range(runs + 1):  # the first starts the worker; the others reuse it
        ev = evaluate(task, [spec], "cuda")
        verify.append({"seconds": ev.seconds, "phases": ev.phases, "worker_pid": ev.worker_pid})
    ev = evaluate(task, [spec], "cuda", time_it=True, peers=["eager"], shapes=[BENCH_SHAPE])
    rule_samples = {v.label: v.shapes[BENCH_SHAPE] for v in ev.verdicts}
    measured = sum(
        sum(s.blocks_s) / max(len(s.blocks_s), 1) * s.n_samples for s in rule_samples.values()
    )
    return {
        "verify": verify,
        "bench_one_shape": {
            "seconds": ev.seconds,
            "phases": ev.phases,
            "inside_measured_samples_s": measured,
            "samples": {k: s.n_samples for k, s in rule_samples.items()},
            "accepted": {v.label: v.accepted for v in ev.verdicts},
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="warm runs (default 3)")
    parser.add_argument("--out", default="evaluator_cost.json", help="JSON output path")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU (torch.cuda.is_available() is false)")

    command = ["verify", TASK, CANDIDATE]
    with tempfile.TemporaryDirectory(prefix="triton-cold-") as cache:
        cold_env = {**os.environ, "TRITON_CACHE_DIR": cache}
        cold_s, cold = cli_seconds(command, cold_env)
    warm = [cli_seconds(command, dict(os.environ)) for _ in range(args.runs)]
    if cold["verdict"] != "accepted" or any(w[1]["verdict"] != "accepted" for w in warm):
        raise SystemExit(f"the candidate was rejected: {cold['reasons']}")
    detail = in_process(args.runs)
    warm_s = [w[0] for w in warm]
    cli_eval = [w[1]["seconds"] for w in warm]
    first, *again = detail["verify"]
    verify_phases = again[-1]["phases"] if again else first["phases"]
    bench = detail["bench_one_shape"]
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "command": f"autotune {' '.join(command)} --device cuda",
        "shapes_verified": len(cold.get("shapes", {})),
        "cli_cold_s": cold_s,
        "cli_warm_s": warm_s,
        "cli_warm_median_s": statistics.median(warm_s),
        "cli_evaluate_s": cli_eval,
        "in_process_first_s": first["seconds"],
        "in_process_first_phases": first["phases"],
        "in_process_again_s": [v["seconds"] for v in again],
        "worker_reused": [v["phases"].get("worker_reused") for v in again],
        "verify_phases_s": verify_phases,
        "bench": bench,
        "measurement_share_of_bench": bench["inside_measured_samples_s"] / bench["seconds"],
    }
    print(f"{result['command']} on {result['gpu']} ({result['shapes_verified']} shapes)")
    print(f"  CLI cold (fresh Triton cache): {cold_s:.2f} s")
    print(f"  CLI warm: median {result['cli_warm_median_s']:.2f} s of {args.runs}")
    print(f"  evaluate() inside those CLI runs: {', '.join(f'{s:.2f}' for s in cli_eval)} s")
    print(f"  evaluate() in one process, first (starts the worker): {first['seconds']:.2f} s")
    print(
        f"  evaluate() in one process, again: {', '.join(f'{v:.2f}' for v in result['in_process_again_s'])} s"
        f" (worker reused: {result['worker_reused']})"
    )
    print(
        "  worker phases (last verify): "
        + ", ".join(f"{k} {v:.2f}" for k, v in verify_phases.items() if isinstance(v, float))
    )
    print(
        f"  bench {BENCH_SHAPE} vs eager: {bench['seconds']:.2f} s, of which "
        f"{bench['inside_measured_samples_s']:.3f} s inside measured samples"
    )
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

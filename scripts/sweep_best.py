"""The fastest accepted configuration at one shape of a config sweep's JSON (the `sweep` of
scripts/bench_attention_gemm_gpu.sh: `verdicts`, each with `params`, `verdict` and per-shape
`blocks_s`), printed as the JSON object to pass to `autotune bench --params`.

    python3 scripts/sweep_best.py SWEEP_JSON SHAPE
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def best_params(sweep: dict, shape: str) -> dict:
    """The params of the accepted candidate with the least median block time at `shape` (the
    sweep's own file's: a config of another candidate file, labelled FILE:cfgN, is left out);
    ValueError where no accepted candidate was timed there."""
    timed = [
        (statistics.median(v["shapes"][shape]["blocks_s"]), v["params"])
        for v in sweep.get("verdicts", [])
        if v.get("kind") == "candidate"
        and ":" not in v.get("label", "")
        and v.get("verdict") == "accepted"
        and (v.get("shapes", {}).get(shape) or {}).get("blocks_s")
    ]
    if not timed:
        raise ValueError(f"no accepted candidate was timed at {shape!r}")
    return min(timed, key=lambda t: t[0])[1]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    path, shape = Path(args[0]), args[1]
    try:
        print(json.dumps(best_params(json.loads(path.read_text()), shape), sort_keys=True))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        print(f"sweep_best: {path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

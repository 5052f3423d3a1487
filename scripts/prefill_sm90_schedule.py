"""What Triton builds of the causal prefill attention kernel for Hopper (sm_90), per
configuration, compiled here without a GPU: registers, spilled bytes, shared memory, and whether
any exponential of the softmax runs while a wgmma group is in flight.

The last is read from the PTX in program order, counting the wgmma groups in flight: a
`wgmma.commit_group` adds one, a `wgmma.wait_group N` leaves at most N, and an `ex2` issued
while any is in flight overlaps the products (flash attention 3's intra-warpgroup pipelining).
Zero means every product is waited for before the next exponential, and the softmax and the
products take turns. Program order does not follow a loop's back edge: a group committed at
the bottom of a loop body and still in flight at its top is not counted there.

    uv run python scripts/prefill_sm90_schedule.py [--config JSON ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loop.evaluator import validate_params  # noqa: E402
from tests.kernels.task_checks import hopper_build, sm90_resources  # noqa: E402
from tests.source_files import import_file  # noqa: E402

CANDIDATE = ROOT / "kernels" / "prefill_attention" / "triton_prefill_attention.py"
# Llama-2-7B-like heads, as the task's GPU shapes.
HEADS, HEAD_DIM = 32, 128
DEFAULT_CONFIGS = [
    {"loads": "pointer", "block_n": 64},
    {},
    {"block_n": 64, "num_stages": 2, "max_registers": 128},
]
STRIDES = [f"stride_{t}{d}" for t in "qkvo" for d in ("b", "h", "m" if t in "qo" else "n")]


def _params(module, config: dict) -> dict:
    """The candidate `module`'s keyword defaults with `config` over them (a ValueError where
    `config` is outside its PARAMS, as the evaluator refuses it)."""
    problems = validate_params(CANDIDATE, config, module.PARAMS)
    if problems:
        raise ValueError("; ".join(r.message for r in problems))
    defaults = {
        name: p.default
        for name, p in inspect.signature(module.kernel).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return defaults | config


def ex2_in_flight(ptx: str) -> tuple[int, int]:
    """(ex2 instructions while a wgmma group is in flight, ex2 instructions), in program
    order."""
    in_flight = overlapped = total = 0
    for line in ptx.splitlines():
        op = line.strip().rstrip(";").split()
        if not op:
            continue
        if op[0].startswith("wgmma.commit_group"):
            in_flight += 1
        elif op[0].startswith("wgmma.wait_group"):
            in_flight = min(in_flight, int(op[-1]))
        elif op[0].startswith("ex2."):
            total += 1
            overlapped += in_flight > 0
    return overlapped, total


def schedule(config: dict) -> dict:
    """One configuration's sm_90 build (q_len and kv_len multiples of 16, as Triton
    specialises them at the task's GPU shapes): its resources and its exponentials in
    flight."""
    module = import_file(CANDIDATE)
    p = _params(module, config)
    desc = p["loads"] == "descriptor"
    types = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr"), "*bf16")
    types |= dict.fromkeys(("q_len", "kv_len", *STRIDES), "i32") | {"scale_log2": "fp32"}
    constexprs = {"H": HEADS, "D": HEAD_DIM, "BLOCK_M": p["block_m"], "BLOCK_N": p["block_n"]}
    constexprs["DESC"] = desc
    for name in "qkvo":
        rows = p["block_m"] if name in "qo" else p["block_n"]
        if desc:
            types[f"{name}_desc"] = f"tensordesc<bf16[1,1,{rows},{HEAD_DIM}]>"
        else:
            constexprs[f"{name}_desc"] = None
    compiled = hopper_build(
        module._attn_fwd,
        types,
        constexprs,
        p["num_warps"],
        p["num_stages"],
        multiples_of_16=("q_len", "kv_len", *STRIDES),
        max_registers=p["max_registers"] or None,
    )
    overlapped, total = ex2_in_flight(compiled.asm["ptx"])
    return {"config": config, "params": p, **sm90_resources(compiled)} | {
        "ex2_in_flight": overlapped,
        "ex2": total,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", action="append", type=json.loads, help="kernel parameters as JSON [3 built in]"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = [schedule(c) for c in args.config or DEFAULT_CONFIGS]
    print("loads      block_m block_n warps stages maxreg  regs spilled  shared  ex2 in flight")
    for r in rows:
        p = r["params"]
        print(
            f"{p['loads']:<10} {p['block_m']:>7} {p['block_n']:>7} {p['num_warps']:>5}"
            f" {p['num_stages']:>6} {p['max_registers']:>6} {r['registers']:>5}"
            f" {r['spill_bytes']:>7} {r['shared_bytes']:>7}  {r['ex2_in_flight']} of {r['ex2']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What Triton builds of the causal prefill attention kernels for Hopper (sm_90), per
configuration, compiled here without a GPU: registers, spilled bytes, shared memory, and whether
any exponential of the softmax runs while a wgmma group is in flight.

The last is read in program order, counting the wgmma groups in flight, twice: in the PTX
Triton writes (a `wgmma.commit_group` adds one, a `wgmma.wait_group N` leaves at most N) and in
the machine code ptxas makes of it (an HGMMA marked `gsb0` adds one, a `WARPGROUP.DEPBAR.LE
gsb0, N` leaves at most N). An exponential issued while any is in flight overlaps the products
(flash attention 3's intra-warpgroup pipelining). ptxas may wait earlier than the PTX does,
and then only the machine code's count holds. Program order does not follow a loop's back edge:
a group committed at the bottom of a loop body and still in flight at its top is not counted.

A configuration is the Triton candidate's parameters, or the Gluon candidate's with
"candidate": "gluon". With --mla, the mla_prefill_attention task's Triton candidate is built,
at DeepSeek's expanded prefill heads (q and k 128 + 64 rope dims, v 128).

    uv run python scripts/prefill_sm90_schedule.py [--config JSON ...] [--mla] [--json OUT]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loop.evaluator import validate_params  # noqa: E402
from tests.kernels.task_checks import (  # noqa: E402
    ex2_in_flight,
    ex2_in_flight_sass,
    hgmma_groups,
    hopper_build,
    sm90_resources,
    sm90_sass,
)
from tests.source_files import import_file  # noqa: E402

CANDIDATES = {
    "triton": ROOT / "kernels" / "prefill_attention" / "triton_prefill_attention.py",
    "gluon": ROOT / "kernels" / "prefill_attention" / "gluon_prefill_attention.py",
    "mla": ROOT / "kernels" / "mla_prefill_attention" / "triton_mla_prefill_attention.py",
}
# Llama-2-7B-like heads, as the task's GPU shapes; DeepSeek's have 128, each 64 rope dims more.
HEADS, HEAD_DIM = 32, 128
MLA_HEADS, MLA_ROPE_DIM = 128, 64
DEFAULT_CONFIGS = [
    {"loads": "pointer", "block_n": 64},
    {},
    {"block_n": 64, "num_stages": 2, "max_registers": 128},
    {"candidate": "gluon"},
    {"candidate": "gluon", "block_n": 64, "num_stages": 4, "pairs": True},
]
# With --mla: the Triton candidate's defaults and four more tiles of the prefill_mla sweep.
MLA_DEFAULT_CONFIGS = [
    {},
    {"block_n": 128, "num_stages": 2},
    {"block_n": 32, "num_stages": 3},
    {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3},
    {"loads": "pointer", "block_n": 64, "num_stages": 2},
]
STRIDES = [f"stride_{t}{d}" for t in "qkvo" for d in ("b", "h", "m" if t in "qo" else "n")]


def _params(path: Path, module, config: dict) -> dict:
    """The candidate `module`'s keyword defaults with `config` over them (a ValueError where
    `config` is outside its PARAMS, as the evaluator refuses it)."""
    problems = validate_params(path, config, module.PARAMS)
    if problems:
        raise ValueError("; ".join(r.message for r in problems))
    defaults = {
        name: p.default
        for name, p in inspect.signature(module.kernel).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return defaults | config


def _triton_build(p: dict, mla: bool = False):
    """The Triton candidate's kernel at parameters `p` (q_len and kv_len multiples of 16, as
    Triton specialises them at the task's GPU shapes); with `mla`, MLA's at its heads."""
    module = import_file(CANDIDATES["mla" if mla else "triton"])
    desc = p["loads"] == "descriptor"
    types = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr"), "*bf16")
    types |= dict.fromkeys(("q_len", "kv_len", *STRIDES), "i32") | {"scale_log2": "fp32"}
    constexprs = {"H": MLA_HEADS if mla else HEADS, "BLOCK_M": p["block_m"]}
    constexprs |= {"BLOCK_N": p["block_n"], "DESC": desc}
    tiles = [(name, HEAD_DIM) for name in "qkvo"]
    if mla:
        constexprs |= {"DV": HEAD_DIM, "DR": MLA_ROPE_DIM}
        tiles += [("qr", MLA_ROPE_DIM), ("kr", MLA_ROPE_DIM)]
    else:
        constexprs["D"] = HEAD_DIM
    for name, cols in tiles:
        rows = p["block_m"] if name[0] in "qo" else p["block_n"]
        if desc:
            types[f"{name}_desc"] = f"tensordesc<bf16[1,1,{rows},{cols}]>"
        else:
            constexprs[f"{name}_desc"] = None
    return hopper_build(
        module._attn_fwd,
        types,
        constexprs,
        p["num_warps"],
        p["num_stages"],
        multiples_of_16=("q_len", "kv_len", *STRIDES),
        max_registers=p.get("max_registers") or None,
    )


def gluon_build(p: dict, head_dim: int = HEAD_DIM):
    """The Gluon candidate's kernel at parameters `p`: its descriptors' types are those of the
    candidate's own host descriptors (of a bf16 tensor here on the CPU)."""
    from triton.runtime.jit import mangle_type

    module = import_file(CANDIDATES["gluon"])
    t = torch.zeros(1, 1, 1024, head_dim, dtype=torch.bfloat16)
    rows = {"q_desc": module.BLOCK_M, "k_desc": p["block_n"], "v_desc": p["block_n"]}
    types = {name: mangle_type(module._descriptor(t, r)) for name, r in rows.items()}
    types |= {"o_ptr": "*bf16", "q_len": "i32", "kv_len": "i32", "scale_log2": "fp32"}
    constexprs = {"BLOCK_N": p["block_n"], "D": head_dim, "STAGES": p["num_stages"]}
    constexprs["PAIRS"] = p["pairs"]
    return hopper_build(
        module._attn_fwd, types, constexprs, num_warps=4, multiples_of_16=("q_len", "kv_len")
    )


def schedule(config: dict, mla: bool = False) -> dict:
    """One configuration's sm_90 build: its resources and its exponentials in flight."""
    config = dict(config)
    kind = config.pop("candidate", "triton")
    if mla and kind != "triton":
        raise ValueError("--mla builds the Triton candidate only (Gluon's needs equal head dims)")
    path = CANDIDATES["mla" if mla else kind]
    p = _params(path, import_file(path), config)
    compiled = _triton_build(p, mla) if kind == "triton" else gluon_build(p)
    overlapped, total = ex2_in_flight(compiled.asm["ptx"])
    sass = sm90_sass(compiled)
    machine, _ = ex2_in_flight_sass(sass)
    steps, groups = hgmma_groups(sass)
    return {"candidate": kind, "config": config, "params": p, **sm90_resources(compiled)} | {
        "ex2_in_flight": overlapped,
        "ex2_in_flight_sass": machine,
        "ex2": total,
        "hgmma": steps,
        "hgmma_groups": groups,
    }


def _describe(r: dict) -> str:
    p = r["params"]
    if r["candidate"] == "gluon":
        name = "gluon-pair" if p["pairs"] else "gluon"
        return f"{name:<10} {128:>7} {p['block_n']:>7} {'4+4+1':>5} {p['num_stages']:>6} {'-':>6}"
    return (
        f"{p['loads']:<10} {p['block_m']:>7} {p['block_n']:>7} {p['num_warps']:>5}"
        f" {p['num_stages']:>6} {p.get('max_registers', 0):>6}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        action="append",
        type=json.loads,
        help="kernel parameters as JSON [5 built in for each kind of head]",
    )
    parser.add_argument(
        "--mla", action="store_true", help="MLA's heads: q and k 128 + 64 rope dims, v 128"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    defaults = MLA_DEFAULT_CONFIGS if args.mla else DEFAULT_CONFIGS
    rows = [schedule(c, args.mla) for c in args.config or defaults]
    print(
        "loads      block_m block_n warps stages maxreg  regs spilled  shared"
        "  wgmma (groups)  ex2 in flight (PTX, SASS)"
    )
    for r in rows:
        print(
            f"{_describe(r)} {r['registers']:>5} {r['spill_bytes']:>7} {r['shared_bytes']:>7}"
            f"  {r['hgmma']:>5} ({r['hgmma_groups']:>3})"
            f"   {r['ex2_in_flight']}, {r['ex2_in_flight_sass']} of {r['ex2']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the MLA decode split kernels cost a thread on Hopper, per configuration, compiled here
for sm_90 without a GPU: registers, bytes spilled to local memory, shared memory, and whether
its products use wgmma. A configuration that spills, or needs more shared memory than an SM has
(227 KiB), is not worth device time. Then the Gluon candidate's configurations: the same, with
its wgmma instructions and the groups ptxas chains them into, and its exponentials issued while
a group is in flight (tests/kernels/task_checks.py's counts, as scripts/prefill_sm90_schedule.py
reads them).

    uv run python scripts/mla_sm90_resources.py [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kernels.task_checks import (  # noqa: E402
    ex2_in_flight_sass,
    hgmma_groups,
    hopper_build,
    sm90_resources,
    sm90_sass,
)
from tests.source_files import import_file  # noqa: E402

GLUON = ROOT / "kernels" / "mla_decode" / "gluon_mla_decode.py"

# (block_h, block_n, num_warps, num_stages)
CONFIGS = [
    (64, 64, 8, 2), (64, 32, 8, 2), (64, 16, 8, 2), (32, 32, 8, 2), (16, 64, 8, 2),
    (16, 128, 4, 2), (64, 32, 16, 2), (64, 32, 16, 3), (64, 64, 16, 2), (128, 32, 16, 2),
]  # fmt: skip
SMEM_PER_SM = 227 * 1024
INTS = ("H", "kv_len", "tokens_per_split", "n_splits", "stride_qnb", "stride_qnh")
INTS += ("stride_qpb", "stride_qph", "stride_cb", "stride_cn", "stride_pb", "stride_pn")


def resources(kernel, block_h: int, block_n: int, warps: int, stages: int, rows: bool) -> dict:
    """One configuration's sm_90 build of `kernel` (the split kernel), `rows` its
    TOKENS_AS_ROWS."""
    types = dict.fromkeys(("qn_ptr", "qp_ptr", "c_ptr", "p_ptr"), "*bf16")
    types |= dict.fromkeys(("po_ptr", "plse_ptr"), "*fp32")
    types |= dict.fromkeys(INTS, "i32") | {"scale_log2": "fp32"}
    constexprs = {"R": 512, "P": 64, "BLOCK_H": block_h, "BLOCK_N": block_n, "PDL": True}
    constexprs["TOKENS_AS_ROWS"] = rows
    strides = tuple(name for name in INTS if name.startswith("stride_"))
    row = {"tokens_as_rows": rows, "block_h": block_h, "block_n": block_n, "num_warps": warps}
    row["num_stages"] = stages
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Triton prints a refused build's PTX
            compiled = hopper_build(kernel, types, constexprs, warps, stages, strides)
    except Exception as exc:  # ptxas refusing the build is an answer too
        lines = str(exc).strip().splitlines()
        return row | {"error": next((x for x in lines if "fatal" in x), lines[-1])[:160]}
    ptx = compiled.asm["ptx"]
    mma = "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else "none"
    return row | sm90_resources(compiled) | {"mma": mma}


def gluon_build(block_n: int, stages: int, eager_values: bool = False, shared_p: bool = False):
    """The Gluon candidate's split kernel at these parameters, its descriptors' types those of
    the candidate's own host descriptors (of bf16 tensors here on the CPU)."""
    import torch
    from triton.runtime.jit import mangle_type

    module = import_file(GLUON)
    shapes = {"qn_desc": (module.HEADS, 512), "qp_desc": (module.HEADS, 64)}
    shapes |= {"c_desc": (block_n, 512), "p_desc": (block_n, 64)}
    types = {
        name: mangle_type(module._descriptor(torch.zeros(1, 1024, cols, dtype=torch.bfloat16), r))
        for name, (r, cols) in shapes.items()
    }
    types |= {"po_ptr": "*fp32", "plse_ptr": "*fp32", "heads": "i32", "kv_len": "i32"}
    types |= {"tiles_per_split": "i32", "scale_log2": "fp32"}
    constexprs = {"BLOCK_N": block_n, "STAGES": stages, "EAGER_VALUES": eager_values}
    constexprs["SHARED_P"] = shared_p
    return hopper_build(
        module._split_kernel, types, constexprs, num_warps=4, multiples_of_16=("heads", "kv_len")
    )


def gluon_resources(
    block_n: int, stages: int, eager_values: bool = False, shared_p: bool = False
) -> dict:
    """One Gluon configuration's sm_90 build: resources, wgmma groups, exponentials in flight."""
    compiled = gluon_build(block_n, stages, eager_values, shared_p)
    sass = sm90_sass(compiled)
    wgmma, groups = hgmma_groups(sass)
    in_flight, ex2 = ex2_in_flight_sass(sass)
    row = {"block_n": block_n, "num_stages": stages, "eager_values": eager_values}
    row["shared_p"] = shared_p
    row |= sm90_resources(compiled)
    return row | {"wgmma": wgmma, "groups": groups, "ex2": ex2, "ex2_in_flight_sass": in_flight}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    kernel = import_file(ROOT / "kernels" / "mla_decode" / "triton_mla_decode.py")._split_kernel
    rows = [resources(kernel, *cfg, rows) for rows in (False, True) for cfg in CONFIGS]
    print("tokens_as_rows block_h block_n warps stages  regs spilled  shared  mma   fits")
    for r in rows:
        head = f"{r['tokens_as_rows']!s:>14} {r['block_h']:>7} {r['block_n']:>7}"
        head += f" {r['num_warps']:>5} {r['num_stages']:>6}"
        if "error" in r:
            print(f"{head}  does not build: {r['error']}")
            continue
        fits = r["spill_bytes"] == 0 and r["shared_bytes"] <= SMEM_PER_SM
        print(
            f"{head} {r['registers']:>5} {r['spill_bytes']:>7} {r['shared_bytes']:>7}"
            f"  {r['mma']:<8} {'yes' if fits else 'no'}"
        )
    module = import_file(GLUON)
    gluon = [
        gluon_resources(n, s, e, p)
        for n in module.PARAMS["block_n"]
        for s in module.PARAMS["num_stages"]
        for e in module.PARAMS["eager_values"]
        for p in module.PARAMS["shared_p"]
        if module.shared_bytes(n, s, p) <= module.SHARED_BYTES and not (e and p)
    ]
    print(
        "\ngluon block_n stages eager shared  regs spilled  shared  wgmma (groups)"
        "  ex2 in flight (SASS)"
    )
    for r in gluon:
        print(
            f"{r['block_n']:>13} {r['num_stages']:>6} {r['eager_values']!s:>5}"
            f" {r['shared_p']!s:>6} {r['registers']:>5}"
            f" {r['spill_bytes']:>7}"
            f" {r['shared_bytes']:>7} {r['wgmma']:>6} ({r['groups']:>3})"
            f"  {r['ex2_in_flight_sass']} of {r['ex2']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"triton": rows, "gluon": gluon}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

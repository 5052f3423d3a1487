"""What the MLA decode split kernel costs a thread on Hopper, per configuration, compiled here
for sm_90 without a GPU: registers, bytes spilled to local memory, shared memory, and whether
its products use wgmma. A configuration that spills, or needs more shared memory than an SM has
(227 KiB), is not worth device time.

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

from tests.kernels.task_checks import hopper_build, sm90_resources  # noqa: E402
from tests.source_files import import_file  # noqa: E402

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
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

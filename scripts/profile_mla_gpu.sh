#!/usr/bin/env bash
# Nsight Compute counters of the MLA decode split kernel (kernels/mla_decode/triton_mla_decode.py)
# at one task shape and configuration: speed of light, compute and memory workload, warp states,
# scheduler, occupancy and launch, then the warp-stall samples of each SASS instruction (where
# the kernel's time goes, instruction by instruction). Never changes clocks (--clock-control
# none). Writes OUT_DIR/mla-ncu-SHAPE.txt and OUT_DIR/mla-ncu-SHAPE-sass.csv.
#   bash scripts/profile_mla_gpu.sh OUT_DIR SHAPE [CONFIG_JSON]
set -euo pipefail
mkdir -p "$1"
out=$(cd "$1" && pwd)
shape=${2:?usage: $0 OUT_DIR SHAPE [CONFIG_JSON]}
config=${3:-'{}'}
cd "$(dirname "$0")/.."
driver=$(mktemp --suffix=.py)
trap 'rm -f "$driver"' EXIT
cat >"$driver" <<'PY'
import importlib.util
import json
import sys

import torch

from loop.tasks import load_task

task = load_task("mla_decode")
shape = next(s for s in task.module.SHAPES["cuda"] if s["name"] == sys.argv[1])
spec = importlib.util.spec_from_file_location("k", "kernels/mla_decode/triton_mla_decode.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
args = task.module.make_inputs(shape, 1, "cuda")
for _ in range(3):
    module.kernel(*args, **json.loads(sys.argv[2]))
torch.cuda.synchronize()
PY
common=(--clock-control none --target-processes all -k regex:_split_kernel --launch-skip 2 -c 1)
ncu "${common[@]}" --print-units base --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats python3 "$driver" "$shape" "$config" \
    >"$out/mla-ncu-$shape.txt"
ncu "${common[@]}" --section SourceCounters --csv --page source --print-source sass \
    python3 "$driver" "$shape" "$config" >"$out/mla-ncu-$shape-sass.csv"
echo "wrote $out/mla-ncu-$shape.txt ($(wc -l <"$out/mla-ncu-$shape.txt") lines)," \
    "$out/mla-ncu-$shape-sass.csv ($(wc -l <"$out/mla-ncu-$shape-sass.csv") lines)"

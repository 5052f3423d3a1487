#!/usr/bin/env bash
# Nsight Compute counters of the register-resident CuPy softmax (either launch: one row a cluster,
# or pipelined) at prefill 8192 x 128256: speed of
# light, memory workload, warp states, occupancy and launch, for two configurations (both
# launches of each are profiled). Never changes clocks
# (--clock-control none). Writes OUT_DIR/softmax-ncu.csv.
#   bash scripts/profile_softmax_gpu.sh OUT_DIR [CONFIG_JSON ...]
set -euo pipefail
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
configs=("$@")
[ $# -eq 0 ] && configs=('{"threads": 256, "slice_kb": 32}' '{"threads": 128, "slice_kb": 64}')
ncu --clock-control none --csv --print-units base --target-processes all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    -k "regex:softmax_(resident|pipelined)" python3 - "${configs[@]}" >"$out/softmax-ncu.csv" <<'PY'
import importlib.util
import json
import sys

import torch

spec = importlib.util.spec_from_file_location("k", "kernels/softmax/cupy_softmax_resident.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
x = (torch.randn(8192, 128256, device="cuda") * 3).bfloat16()
for config in sys.argv[1:]:
    for _ in range(2):
        module.kernel(x, **json.loads(config))
torch.cuda.synchronize()
PY
echo "wrote $out/softmax-ncu.csv ($(wc -l <"$out/softmax-ncu.csv") lines)"

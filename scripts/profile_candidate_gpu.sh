#!/usr/bin/env bash
# Nsight Compute counters of one kernel of a task candidate at one task shape and configuration:
# speed of light, compute workload (each pipe's use), memory workload, warp states, scheduler,
# occupancy and launch, then the warp-stall samples of each SASS instruction (where the kernel's
# time goes, instruction by instruction). The candidate runs on the task's own inputs, three
# times; the third launch of a kernel matching KERNEL_REGEX is profiled. Never changes clocks
# (--clock-control none). Writes OUT_DIR/ncu-TASK-SHAPE-STEM-HASH-KERNEL.txt and ...-sass.csv.gz
# (gzipped: a megabyte or more as text; scripts/ncu_sass_summary.py reads either form),
# STEM the candidate file's stem, HASH the first 8 hex digits of CONFIG_JSON's md5 and KERNEL
# the regex's letters, digits and underscores (so two configurations, or two kernels of one
# configuration, at one shape keep their own reports).
#   bash scripts/profile_candidate_gpu.sh OUT_DIR TASK CANDIDATE_FILE SHAPE KERNEL_REGEX [CONFIG_JSON]
set -euo pipefail
usage="usage: $0 OUT_DIR TASK CANDIDATE_FILE SHAPE KERNEL_REGEX [CONFIG_JSON]"
mkdir -p "${1:?$usage}"
out=$(cd "$1" && pwd)
task=${2:?$usage} candidate=${3:?$usage} shape=${4:?$usage} regex=${5:?$usage}
config=${6:-'{}'}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
name="$task-$shape-${candidate%.py}-$(printf %s "$config" | md5sum | cut -c1-8)-${regex//[^A-Za-z0-9_]/}"
driver=$(mktemp --suffix=.py)
trap 'rm -f "$driver"' EXIT
cat >"$driver" <<'PY'
import json
import sys

import torch

from loop.tasks import load_task
from tests.source_files import import_file

task = load_task(sys.argv[1])
module = import_file(task.folder / sys.argv[2])
shapes = {s.name: s for s in task.shapes("cuda")}
if sys.argv[3] not in shapes:
    sys.exit(f"{task.name} has no GPU shape {sys.argv[3]!r}; it has {', '.join(shapes)}")
args = task.make_inputs(shapes[sys.argv[3]], 1, "cuda")
for _ in range(3):
    module.kernel(*args, **json.loads(sys.argv[4]))
torch.cuda.synchronize()
PY
common=(--clock-control none --target-processes all -k "regex:$regex" --launch-skip 2 -c 1)
ncu "${common[@]}" --print-units base --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --metrics "regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active" \
    python3 "$driver" "$task" "$candidate" "$shape" "$config" >"$out/ncu-$name.txt"
ncu "${common[@]}" --section SourceCounters --csv --page source --print-source sass \
    python3 "$driver" "$task" "$candidate" "$shape" "$config" >"$out/ncu-$name-sass.csv"
lines=$(wc -l <"$out/ncu-$name-sass.csv")
gzip -9 -n -f "$out/ncu-$name-sass.csv"
echo "wrote $out/ncu-$name.txt ($(wc -l <"$out/ncu-$name.txt") lines)," \
    "$out/ncu-$name-sass.csv.gz ($lines lines)"

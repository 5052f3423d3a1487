#!/usr/bin/env bash
# On the GPU machine: install the carried wheels (.whl/, git-ignored) into a temporary target,
# put the checkout on PYTHONPATH, then run the stages named on the command line:
#   tests   pytest -m gpu
#   bench   tuned Triton RMSNorm against its peers at the large shapes
#   run     the whole `autotune run`
#   host    autotune host check --json
# Logs and JSON are written under a work folder and packed into $OUT/results.tgz (the device
# tool returns at most 8 files); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-out-gpu}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/results.tgz" -C "$OUT" . ; echo "packed $(ls "$OUT" | wc -l) entries into $FINAL/results.tgz"' EXIT
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
autotune() { python3 -m appliance "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.csv"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee "$OUT/versions.txt"

for stage in "$@"; do
    case "$stage" in
    tests)
        python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
        ;;
    host)
        autotune host check --json >"$OUT/host-check.json" 2>"$OUT/host-check.err"
        echo "host check rc=$?"
        ;;
    bench)
        default='{"num_warps":8,"rows_per_program":1,"x_eviction":"evict_first"}'
        for params in ${BENCH_PARAMS:-$default}; do
            tag=$(echo "$params" | tr -dc '0-9_')
            autotune bench rmsnorm triton_rmsnorm.py --params "$params" \
                --shape long-32768x7168 --shape long-131072x4096 --shape prefill-4096x4096 --shape decode-16x7168 \
                --json >"$OUT/bench-$tag.json" 2>"$OUT/bench-$tag.err"
            echo "bench $params rc=$?"
        done
        ;;
    run)
        timeout "${RUN_TIMEOUT:-3000}" python3 -m appliance run --out "$OUT/run" ${RUN_ARGS:-} 2>&1 | tee "$OUT/run.log" | tail -40
        ;;
    esac
done

#!/usr/bin/env bash
# On the GPU machine: install the carried wheels (WHL_DIR, default .whl/, git-ignored) into a
# temporary target, put the checkout on PYTHONPATH, then run the stages named on the command
# line. A folder of jsonschema and its three dependencies keeps the carried tree small and is
# enough for e2e, gemmattn, profile-kernels, the kernel tests and memtasks' sweeps (--sweep
# --no-bench); memtasks' benches, run, fullrun and search import optuna (and its SQL stack)
# too, as do four modules of tests/loop, and
# tests/appliance/fleet needs fabric, so a tests stage over those folders needs the whole .whl.
# The stages:
#   tests   pytest -m gpu (TESTS: paths and options, split on spaces; TESTS_K: a -k expression,
#           which may hold spaces, e.g. TESTS_K="gluon or fold"); the log names each test and its
#           outcome, so a run cut short by its limit still says which tests passed
#   tables  scripts/verify_dispatch_gpu.py: every candidate entry of the dispatch tables in
#           TABLES_DIR verified with the evaluator at its shapes (ragged twins, capture; TABLES_ARGS)
#   bench   tuned Triton RMSNorm against its peers at the large shapes
#   run     the whole `autotune run`
#   host    autotune host check --json
#   fullrun   autotune run --apply --simulate h200 (profile on the simulated device only)
#   cost      scripts/bench_evaluator_cost.py
#   repro     scripts/baseline_repro.py (the suite twice, separate processes)
#   search    scripts/bench_search_efficiency.py --measure-only (simulate later on the CPU)
#   verify    autotune report verify of the run's report, in a separate process
#   memtasks  scripts/bench_tasks_gpu.py (the memory-bound tasks; MEMTASKS_ARGS)
#   gemmattn  scripts/bench_attention_gemm_gpu.sh (GEMMATTN_STAGES)
#   aa      scripts/aa_decisions.py: A/A and 1 % slowdown decisions, their cost, per-shape bias
#   sweep   scripts/rmsnorm_sweep.py: every RMSNorm variant at one shape, inductor's code dumped
#   allreduce scripts/bench_allreduce_gpu.sh: P2P baselines and the all-reduce task (2+ GPUs)
#   dispatch  scripts/dispatch_from_bench.py: dispatch tables and their Markdown from the bench
#             JSON of earlier memtasks/gemmattn stages in the same call (and DISPATCH_FROM folders),
#             over a copy of DISPATCH_BASE's tables where set (the tasks benched replace theirs)
#   e2e       scripts/bench_e2e_block.py: decoder blocks eager / compiled / tuned (E2E_KINDS; the
#             dispatch tables in E2E_DISPATCH, else those of an earlier dispatch, fullrun or run
#             stage in the same call; E2E_ARGS, e.g. "--sizes decode:1:4096 --profile")
#   e2e2..e2e9  the same again into e2eN.json, with E2EN_DISPATCH (default as e2e's), E2EN_KINDS
#             and E2EN_ARGS (an A/B of two tables, or of --inductor-pdl, in one call); with
#             E2E_DISPATCH set, only a folder named in E2EN_DISPATCH replaces it (tables built in
#             this call are for the e2e stage)
#   profile   ncu's key counters of the Triton RMSNorm (a recorded fixture for the brief's parser)
#   profile-kernels  scripts/profile_candidate_gpu.sh once per line of PROFILES, "TASK CANDIDATE
#             SHAPE KERNEL_REGEX [CONFIG_JSON]": ncu sections and stalls per SASS instruction
#   profile-softmax  scripts/profile_softmax_gpu.sh: ncu of the register-resident CuPy softmax
#   memtasks2 the same script again with MEMTASKS2_ARGS, into the same folder (e.g. benches of
#             earlier sweeps' best with --best-from after a memtasks stage that sweeps)
#   floor     scripts/bench_timer_floor.py: the timer's floor (an empty kernel, reads of decode sizes)
# With GPU_CHECK_CARD set (H200, say), no stage runs unless the card's name holds it (the exit
# status is then 3): a device tool may lend another card than the one asked for, and timings meant
# for one card are no use taken on another.
# Every stage gets at most its own limit and what is left of GPU_CHECK_BUDGET seconds (default
# 570, under the device tool's 600 s a command), so a slow stage never loses the packed results.
# Logs and JSON are written under a work folder and packed into $OUT/results.tgz (the device
# tool returns at most 8 files); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-out-gpu}
OUT=$(mktemp -d)
mkdir -p "$FINAL"
trap 'tar czf "$FINAL/results.tgz" -C "$OUT" . ; echo "packed $(ls "$OUT" | wc -l) entries into $FINAL/results.tgz"' EXIT
WHL_DIR=${WHL_DIR:-.whl}
if [ -d "$WHL_DIR" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHL_DIR"/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
autotune() { python3 -m appliance "$@"; }
END=$(( $(date +%s) + ${GPU_CHECK_BUDGET:-570} ))
# limit DEFAULT: the smaller of DEFAULT and the seconds left before END (less 15 s for packing)
limit() { local left=$(( END - $(date +%s) - 15 )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.csv"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee "$OUT/versions.txt"
if [ -n "${GPU_CHECK_CARD:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -qi -- "$GPU_CHECK_CARD"; then
    echo "the card is not an $GPU_CHECK_CARD (GPU_CHECK_CARD): no stage run"
    exit 3
fi

for stage in "$@"; do
    if [ "$(limit 9999)" -lt 30 ]; then echo "stage $stage skipped: no time left"; continue; fi
    echo "== stage $stage at $(date -u +%T), $(limit 9999) s left"
    case "$stage" in
    tests)
        select=()
        [ -n "${TESTS_K:-}" ] && select=(-k "$TESTS_K")
        timeout "$(limit "${TESTS_TIMEOUT:-300}")" python3 -m pytest -v -m gpu -p no:cacheprovider \
            --timeout "${TEST_TIMEOUT:-300}" "${select[@]}" ${TESTS:---ignore=tests/appliance/fleet tests} 2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
        ;;
    tables)
        timeout "$(limit "${TABLES_TIMEOUT:-400}")" python3 scripts/verify_dispatch_gpu.py \
            "${TABLES_DIR:?tables needs TABLES_DIR}" --json "$OUT/tables.json" ${TABLES_ARGS:-} 2>&1 |
            tee "$OUT/tables.log" | tail -60
        ;;
    allreduce)
        PYTHON=python3 timeout "$(limit "${ALLREDUCE_TIMEOUT:-240}")" bash scripts/bench_allreduce_gpu.sh "$OUT/allreduce" 2>&1 | tee "$OUT/allreduce.log" | tail -40
        ;;
    dispatch)
        sources=()
        for d in "$OUT/memtasks" "$OUT/gemmattn" ${DISPATCH_FROM:-}; do
            [ -e "$d" ] && sources+=("$d")
        done
        if [ -n "${DISPATCH_BASE:-}" ]; then
            mkdir -p "$OUT/dispatch" && cp "$DISPATCH_BASE"/dispatch-*.json "$OUT/dispatch/"
        fi
        timeout "$(limit 120)" python3 scripts/dispatch_from_bench.py "$OUT/dispatch" \
            "${sources[@]}" --markdown "$OUT/dispatch/dispatch.md" 2>&1 | tee "$OUT/dispatch.log" |
            grep -v '^|' | tail -20
        ;;
    e2e|e2e[2-9])
        n=${stage#e2e}
        dispatch_var=E2E${n}_DISPATCH args_var=E2E${n}_ARGS kinds_var=E2E${n}_KINDS
        tables=${!dispatch_var:-${E2E_DISPATCH:-$([ -d "$OUT/dispatch" ] && echo "$OUT/dispatch" || echo "$OUT/run")}}
        timeout "$(limit "${E2E_TIMEOUT:-300}")" python3 scripts/bench_e2e_block.py --dispatch-dir "$tables" \
            --kinds "${!kinds_var:-${E2E_KINDS:-llama}}" --json "$OUT/$stage.json" ${!args_var:-} 2>&1 |
            tee "$OUT/$stage.log" | tail -30
        ;;
    profile-kernels)
        while read -r task cand shape regex config <&3; do
            case "$task" in "" | "#"*) continue ;; esac
            if [ "$(limit 9999)" -lt 30 ]; then echo "profile of $task $shape skipped: no time left"; break; fi
            timeout "$(limit 150)" bash scripts/profile_candidate_gpu.sh "$OUT/profile" "$task" \
                "$cand" "$shape" "$regex" "${config:-{\}}" 2>&1 | tee -a "$OUT/profile-kernels.log" | tail -3
        done 3<<<"${PROFILES:?profile-kernels needs PROFILES}"
        ;;
    profile-softmax)
        timeout "$(limit 150)" bash scripts/profile_softmax_gpu.sh "$OUT/profile" 2>&1 |
            tee "$OUT/profile-softmax.log" | tail -5
        ;;
    profile)
        timeout "$(limit 120)" ncu --clock-control none --csv --print-units base --target-processes all \
            --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
            -k regex:rmsnorm --launch-skip 1 -c 1 python3 -c "
import importlib, torch
task = importlib.import_module('kernels.rmsnorm.task')
cand = importlib.import_module('kernels.rmsnorm.triton_rmsnorm')
shape = next(s for s in task.SHAPES['cuda'] if s['name'] == 'long-32768x7168')
args = task.make_inputs(shape, 1, 'cuda')
for _ in range(3):
    cand.kernel(*args)
torch.cuda.synchronize()
" >"$OUT/ncu-rmsnorm.csv" 2>"$OUT/ncu-rmsnorm.err"
        echo "ncu rc=$?"; tail -3 "$OUT/ncu-rmsnorm.err"; head -c 600 "$OUT/ncu-rmsnorm.csv"
        ;;
    sweep)
        TORCH_LOGS=output_code timeout "$(limit 300)" python3 scripts/rmsnorm_sweep.py "$OUT/sweep.json" ${SWEEP_SHAPE:-} \
            2>"$OUT/sweep-inductor.log" | tee "$OUT/sweep.log"
        best=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['best'])" "$OUT/sweep.json")
        echo "sweep best: $best"
        BENCH_PARAMS=$(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['top']))" "$OUT/sweep.json")
        ;;
    fullrun)
        timeout "$(limit "${RUN_TIMEOUT:-420}")" python3 -m appliance run --out "$OUT/run" --apply --simulate h200 ${RUN_ARGS:-} 2>&1 | tee "$OUT/run.log" | tail -40
        ;;
    cost)
        timeout "$(limit 240)" python3 scripts/bench_evaluator_cost.py --out "$OUT/evaluator-cost.json" 2>&1 | tee "$OUT/cost.log" | tail -15
        ;;
    repro)
        timeout "$(limit 420)" python3 scripts/baseline_repro.py "$OUT/baseline-repro.json" --device cuda 2>&1 | tee "$OUT/repro.log" | tail -15
        ;;
    search)
        timeout "$(limit 240)" python3 scripts/bench_search_efficiency.py --measure-only --out "$OUT/search-measured.json" 2>&1 | tee "$OUT/search.log" | tail -15
        ;;
    verify)
        timeout "$(limit "${VERIFY_TIMEOUT:-300}")" python3 -m appliance report verify "$OUT/run/report.json" --json >"$OUT/verify.json" 2>"$OUT/verify.err"
        echo "report verify rc=$?"; tail -5 "$OUT/verify.err"
        ;;
    memtasks)
        timeout "$(limit "${MEMTASKS_TIMEOUT:-330}")" python3 scripts/bench_tasks_gpu.py "$OUT/memtasks" ${MEMTASKS_ARGS:---sweep --no-bench} 2>&1 | tee "$OUT/memtasks.log" | tail -30
        ;;
    memtasks2)
        timeout "$(limit "${MEMTASKS_TIMEOUT:-330}")" python3 scripts/bench_tasks_gpu.py "$OUT/memtasks" ${MEMTASKS2_ARGS:?memtasks2 needs MEMTASKS2_ARGS} 2>&1 | tee "$OUT/memtasks2.log" | tail -30
        ;;
    gemmattn)
        timeout "$(limit "${GEMMATTN_TIMEOUT:-330}")" bash scripts/bench_attention_gemm_gpu.sh "$OUT/gemmattn" ${GEMMATTN_STAGES:-skinny_gemm gqa_decode} 2>&1 | tee "$OUT/gemmattn.log" | tail -30
        ;;
    floor)
        timeout "$(limit 120)" python3 scripts/bench_timer_floor.py --json "$OUT/floor.json" 2>&1 | tee "$OUT/floor.log" | tail -12
        ;;
    aa)
        timeout "$(limit "${AA_TIMEOUT:-300}")" python3 scripts/aa_decisions.py "$OUT/aa-decisions.json" ${AA_ARGS:-} 2>&1 | tee "$OUT/aa.log" | tail -30
        ;;
    host)
        timeout "$(limit 60)" python3 -m appliance host check --json >"$OUT/host-check.json" 2>"$OUT/host-check.err"
        echo "host check rc=$?"
        ;;
    bench)
        default='{"num_warps":4,"rows_per_program":1,"x_eviction":"","chunk":0}'
        for params in ${BENCH_PARAMS:-$default}; do
            tag=$(echo "$params" | md5sum | cut -c1-8)
            timeout "$(limit 120)" python3 -m appliance bench rmsnorm triton_rmsnorm.py --params "$params" \
                --shape long-32768x7168 --shape long-131072x4096 --shape prefill-4096x4096 --shape decode-16x7168 \
                --json >"$OUT/bench-$tag.json" 2>"$OUT/bench-$tag.err"
            echo "bench $params rc=$?"
        done
        ;;
    run)
        timeout "$(limit "${RUN_TIMEOUT:-3000}")" python3 -m appliance run --out "$OUT/run" ${RUN_ARGS:-} 2>&1 | tee "$OUT/run.log" | tail -40
        ;;
    esac
done

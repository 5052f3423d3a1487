#!/usr/bin/env bash
# On the GPU machine: time the Triton (and CuPy) candidates of skinny_gemm, gqa_decode, mla_decode,
# prefill_attention and fp8_gemm against their peers at the headline shapes (`autotune bench`),
# then a few configs each against one peer in a single worker. One JSON per call goes into DIR
# (stderr beside it in .err), and a summary is printed last. NO_SWEEP=1 skips the config sweeps.
#
#   scripts/bench_attention_gemm_gpu.sh DIR [skinny_gemm] [cupy] [gqa_decode] [gqa_b1]
#       [gqa_b1short] [gqa_fold] [gqa_early] [gqa_gluon] [gqa_b1gluon] [mla_decode] [mla_b1]
#       [mla_gluon] [mla_rows] [prefill_attention] [prefill_desc] [prefill_gluon] [prefill_mla]
#       [fp8_gemm]
#
# No stage named: all but gqa_b1, gqa_b1short, gqa_fold, gqa_early, gqa_gluon, gqa_b1gluon, mla_b1,
# mla_gluon, mla_rows, prefill_desc, prefill_gluon and prefill_mla (estimated 5-7 minutes on an
# H200; split across calls if needed).
# With .whl/ present, the wheels are installed into /tmp/site first (as scripts/gpu-check.sh
# does). PER_CALL_S (default 300) caps each call: a 7-shape bench against torch.compile outran
# 150 s on the H200.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: $0 DIR [stage...]}
shift
STAGES=${*:-skinny_gemm cupy gqa_decode mla_decode prefill_attention fp8_gemm}
PER_CALL_S=${PER_CALL_S:-300}
mkdir -p "$DIR"
if [ -d .whl ] && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-}${PYTHONPATH:+:}$([ -d /tmp/site ] && echo /tmp/site:)$PWD
export PYTHONUNBUFFERED=1

# bench TASK CANDIDATE TAG PARAMS "PEER ARGS" SHAPE...
bench() {
    local task=$1 cand=$2 tag=$3 params=$4 peers=$5
    shift 5
    local shape_args=()
    for s in "$@"; do shape_args+=(--shape "$s"); done
    local t0=$SECONDS
    # shellcheck disable=SC2086
    timeout "$PER_CALL_S" python3 -m appliance bench "$task" "$cand" --params "$params" \
        --device "${DEVICE:-cuda}" $peers "${shape_args[@]}" --json >"$DIR/$task-$tag.json" 2>"$DIR/$task-$tag.err"
    echo "$task $tag rc=$? $((SECONDS - t0))s"
}

# sweep TASK CANDIDATE TAG PEER SHAPES(comma-separated) PARAMS...: every config in one worker,
# timed interleaved with the peer (one process start instead of one per config). A config
# written FILE{...} is another candidate file of the task's (candidates against each other); its
# verdict's label is FILE:cfgN, and bench_best leaves it out.
sweep() {
    local task=$1 cand=$2 tag=$3 peer=$4 shapes=$5
    shift 5
    [ -n "${NO_SWEEP:-}" ] && return
    local t0=$SECONDS
    timeout "$PER_CALL_S" python3 - "$task" "$cand" "$peer" "$shapes" "$@" >"$DIR/$task-$tag.json" \
        2>"$DIR/$task-$tag.err" <<'PY'
import json, os, sys
from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task

task_name, cand, peer, shapes, *configs = sys.argv[1:]
task = load_task(task_name)
specs = []
for i, c in enumerate(configs):
    brace = c.find("{")
    if brace < 0:
        sys.exit(f"sweep config {c!r} is neither {{...}} nor FILE{{...}}")
    other = c[:brace]  # another candidate file: its label names it (sweep_best skips it)
    label = f"{other}:cfg{i}" if other else f"cfg{i}"
    specs.append(CandidateSpec(task.folder / (other or cand), json.loads(c[brace:]), label))
device = os.environ.get("DEVICE", "cuda")
ev = evaluate(task, specs, device, time_it=True, peers=[peer], shapes=shapes.split(","))
print(json.dumps({"task": task.name, "sweep": True, "seconds": ev.seconds,
                  "verdicts": [v.to_dict() for v in ev.verdicts]}))
PY
    echo "$task $tag rc=$? $((SECONDS - t0))s"
}

# bench_best TASK CANDIDATE SWEEP_TAG SHAPE...: for each shape, the fastest accepted config of the
# sweep DIR/TASK-SWEEP_TAG.json there (scripts/sweep_best.py) against every peer.
bench_best() {
    local task=$1 cand=$2 tag=$3 best
    shift 3
    for shape in "$@"; do
        best=$(python3 scripts/sweep_best.py "$DIR/$task-$tag.json" "$shape") &&
            bench "$task" "$cand" "${tag}best-$shape" "$best" "" "$shape"
    done
}

for stage in $STAGES; do
    case "$stage" in
    skinny_gemm)
        # The Llama-3-8B projections the decoder block calls (qkv, o, gate+up, down) at M 1 and
        # 16, and DeepSeek-V3's down projection. No torch.compile peer: inductor's matmul is an
        # extern cuBLAS call, and compiling every shape outran 150 s on the H200.
        shapes=()
        for nk in n6144-k4096 n4096-k4096 n28672-k4096 n4096-k14336 n7168-k18432; do
            shapes+=(m1-$nk m16-$nk)
        done
        bench skinny_gemm triton_skinny_gemm.py default \
            '{"block_m":16,"block_n":64,"block_k":128,"split_k":4,"num_warps":4,"num_stages":4}' \
            "--peer cublas --peer eager" "${shapes[@]}"
        sweep skinny_gemm triton_skinny_gemm.py sweep cublas m1-n7168-k7168,m16-n7168-k7168,m64-n7168-k7168 \
            '{"block_m":16,"block_n":32,"block_k":256,"split_k":2,"num_warps":4,"num_stages":3}' \
            '{"block_m":16,"block_n":128,"block_k":128,"split_k":8,"num_warps":8,"num_stages":4}' \
            '{"block_m":16,"block_n":64,"block_k":256,"split_k":1,"num_warps":4,"num_stages":4}' \
            '{"block_m":16,"block_n":32,"block_k":128,"split_k":8,"num_warps":4,"num_stages":5}' \
            '{"block_m":64,"block_n":128,"block_k":64,"split_k":2,"num_warps":8,"num_stages":4}'
        ;;
    cupy)
        sweep skinny_gemm cupy_gemv.py cupy cublas m1-n7168-k7168,m4-n7168-k7168,m16-n7168-k7168,m1-n4096-k14336 \
            '{"rows":4,"warps_per_block":8,"unroll":4}' '{"rows":16,"warps_per_block":4,"unroll":2}' \
            '{"rows":4,"warps_per_block":4,"unroll":8}' '{"rows":8,"warps_per_block":8,"unroll":4}'
        ;;
    gqa_decode)
        # Default peers: eager (expanded KV), torch.compile, sdpa-gqa, flash-attn when installed.
        bench gqa_decode triton_gqa_decode.py default '{}' "" \
            b1-kv131072 b4-kv131072 b1-kv32768 b16-kv8192 b64-kv2048
        sweep gqa_decode triton_gqa_decode.py sweep eager b1-kv131072,b1-kv32768,b4-kv131072,b16-kv8192 \
            '{}' \
            '{"block_n":128,"num_warps":8,"num_stages":2}' \
            '{"block_n":32,"num_warps":2,"num_stages":4,"programs_per_sm":8}' \
            '{"block_n":64,"num_warps":4,"num_stages":4,"split_tokens":1024}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"use_dot":false}' \
            '{"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":2}' \
            '{"block_n":128,"num_warps":4,"num_stages":3,"programs_per_sm":8}' \
            '{"block_n":64,"num_warps":4,"num_stages":4,"programs_per_sm":8}'
        ;;
    gqa_b1short)
        # Batch 1 at 4096 tokens, the decoder block's short cache: 2048-token splits give 16
        # programs (0.49x SDPA, session 9); shorter splits fill the GPU. First the best of the
        # sweep below (session 10, call 2) against every peer.
        bench gqa_decode triton_gqa_decode.py b1short-best \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256}' "" b1-kv4096
        sweep gqa_decode triton_gqa_decode.py b1short sdpa-gqa b1-kv4096 \
            '{}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256}' \
            '{"block_n":128,"num_warps":8,"num_stages":2,"split_tokens":256}' \
            '{"block_n":64,"num_warps":4,"num_stages":2,"split_tokens":256}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":512}' \
            '{"block_n":32,"num_warps":2,"num_stages":4,"split_tokens":256}' \
            '{"block_n":32,"num_warps":4,"num_stages":3,"split_tokens":256}' \
            '{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":512}' \
            '{"block_n":64,"num_warps":8,"num_stages":4,"split_tokens":256}'
        ;;
    gqa_fold)
        # Batch 1, the decoder block's caches: the tables' launches (session 10) as two kernels
        # (the split kernel, then the merge) and with the merge folded into the split kernel,
        # each against every peer; then a few more folded launches against SDPA at 4096 tokens.
        bench gqa_decode triton_gqa_decode.py kernel4k \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256}' "" b1-kv4096
        bench gqa_decode triton_gqa_decode.py fold4k \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"merge":"fold"}' "" b1-kv4096
        bench gqa_decode triton_gqa_decode.py kernel32k \
            '{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":2048}' "" b1-kv32768
        bench gqa_decode triton_gqa_decode.py fold32k \
            '{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":2048,"merge":"fold"}' "" b1-kv32768
        sweep gqa_decode triton_gqa_decode.py foldsweep sdpa-gqa b1-kv4096 \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"merge":"fold"}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":512,"merge":"fold"}' \
            '{"block_n":128,"num_warps":8,"num_stages":2,"split_tokens":256,"merge":"fold"}' \
            '{"block_n":64,"num_warps":8,"num_stages":3,"split_tokens":256,"merge":"fold"}' \
            '{"block_n":32,"num_warps":4,"num_stages":3,"split_tokens":256,"merge":"fold"}'
        ;;
    gqa_gluon)
        # The Gluon candidate (a program a sequence and KV head, or a split of its cache, a loader
        # warp's TMA ring) where SDPA keeps the table: rings and splits swept against sdpa-gqa,
        # then the fastest at each shape against every peer.
        sweep gqa_decode gluon_gqa_decode.py gluon sdpa-gqa b16-kv8192,b64-kv2048 \
            '{"block_n":64,"num_stages":3}' '{"block_n":64,"num_stages":4}' \
            '{"block_n":64,"num_stages":6}' '{"block_n":128,"num_stages":3}' \
            '{"block_n":128,"num_stages":2}' '{"block_n":32,"num_stages":8}'
        bench_best gqa_decode gluon_gqa_decode.py gluon b16-kv8192 b64-kv2048
        # The long caches at batch 1 and 4, cut into splits merged by the last to arrive.
        sweep gqa_decode gluon_gqa_decode.py gluonlong sdpa-gqa b1-kv32768,b1-kv131072,b4-kv131072 \
            '{}' '{"num_stages":4}' '{"block_n":64,"num_stages":6}' \
            '{"block_n":128,"num_stages":3}' '{"split_tokens":4096}' '{"split_tokens":8192}'
        bench_best gqa_decode gluon_gqa_decode.py gluonlong b1-kv32768 b1-kv131072 b4-kv131072
        ;;
    gqa_b1gluon)
        # Batch 1, the tables' Triton fold (session 10's configurations, block tables and per-op
        # table) against the Gluon candidate's splits, in one interleaved sweep against SDPA.
        sweep gqa_decode gluon_gqa_decode.py b1gluon sdpa-gqa b1-kv4096,b1-kv32768,b1-kv131072 \
            'triton_gqa_decode.py{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"merge":"fold"}' \
            'triton_gqa_decode.py{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":2048,"merge":"fold"}' \
            '{}' '{"block_n":32,"num_stages":4}' '{"block_n":32,"num_stages":4,"split_tokens":128}' \
            '{"block_n":64,"num_stages":3,"split_tokens":128}' '{"block_n":128,"num_stages":2}'
        ;;
    gqa_early)
        # Batch 1 with early_history (the first tile's K and V, all but the new slot, loaded
        # before gdc_wait) and prefetch_l2 (the split's lines asked of L2 before it): alone
        # nothing drains before it, so the bench checks them on the GPU and what they cost;
        # what they gain shows only in the block (bench_e2e_block --also).
        bench gqa_decode triton_gqa_decode.py early4k \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"early_history":true}' "" b1-kv4096
        bench gqa_decode triton_gqa_decode.py early32k \
            '{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":2048,"early_history":true}' "" b1-kv32768
        sweep gqa_decode triton_gqa_decode.py earlysweep sdpa-gqa b1-kv4096 \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"early_history":true}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":128,"early_history":true}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":64,"early_history":true}' \
            '{"block_n":32,"num_warps":4,"num_stages":3,"split_tokens":64,"early_history":true}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"prefetch_l2":true}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":256,"prefetch_l2":true,"early_history":true}'
        ;;
    gqa_b1)
        # Batch 1, where the kernel streams at 88 % (131072 tokens) and 74 % (32768) of copy and
        # SDPA is 3-7 % faster (session 8): split sizes, tile heights and pipeline depths there.
        # First the best of session 9's sweep (call 2) against every peer, with 4096 tokens too,
        # the decoder block's short cache.
        bench gqa_decode triton_gqa_decode.py b1best \
            '{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":2048}' "" \
            b1-kv4096 b1-kv32768 b1-kv131072
        sweep gqa_decode triton_gqa_decode.py b1 sdpa-gqa b1-kv131072,b1-kv32768 \
            '{}' \
            '{"block_n":64,"num_warps":4,"num_stages":3,"split_tokens":1024}' \
            '{"block_n":64,"num_warps":4,"num_stages":2,"split_tokens":512}' \
            '{"block_n":32,"num_warps":2,"num_stages":4,"split_tokens":1024}' \
            '{"block_n":32,"num_warps":2,"num_stages":3,"split_tokens":512}' \
            '{"block_n":32,"num_warps":4,"num_stages":5,"split_tokens":1024}' \
            '{"block_n":64,"num_warps":2,"num_stages":4,"split_tokens":1024}' \
            '{"block_n":64,"num_warps":8,"num_stages":4,"split_tokens":2048}' \
            '{"block_n":128,"num_warps":8,"num_stages":3,"split_tokens":2048}' \
            '{"block_n":128,"num_warps":4,"num_stages":2,"split_tokens":1024}'
        ;;
    mla_decode)
        # Default peers: eager (DeepSeek's einsum decode), torch.compile, sdpa-mqa.
        bench mla_decode triton_mla_decode.py default '{}' "" b1-kv131072 b4-kv131072 b16-kv8192 b64-kv4096
        sweep mla_decode triton_mla_decode.py sweep eager b1-kv131072,b16-kv8192,b64-kv4096 \
            '{}' \
            '{"block_h":64,"block_n":64,"num_warps":8,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":64,"block_n":64,"num_warps":8,"num_stages":1,"programs_per_sm":2}' \
            '{"block_h":64,"block_n":32,"num_warps":8,"num_stages":2,"programs_per_sm":2}' \
            '{"block_h":64,"block_n":32,"num_warps":4,"num_stages":3,"programs_per_sm":2}' \
            '{"block_h":64,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":32,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":2}' \
            '{"block_h":64,"block_n":16,"num_warps":4,"num_stages":3,"programs_per_sm":2}' \
            '{"block_h":16,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":4}' \
            '{"block_h":64,"block_n":32,"num_warps":8,"num_stages":3,"programs_per_sm":1}' \
            '{"block_h":64,"block_n":128,"num_warps":8,"num_stages":1,"programs_per_sm":1}' \
            '{"block_h":32,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":64,"block_n":64,"num_warps":8,"num_stages":3,"programs_per_sm":1}'
        ;;
    mla_b1)
        # Batch 1 at 4096 and 32768 tokens, the DeepSeek block's decode sizes, which the table
        # served from the 131072-token entry (64 splits of 128 heads x 512 fp32 partials: 16.8
        # MB written and merged, for 4.7 MB of cache at 4096). Configs with fewer partials, then
        # the fastest at each size against every peer.
        sweep mla_decode triton_mla_decode.py b1 eager b1-kv4096,b1-kv32768 \
            '{}' \
            '{"block_h":16,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":32,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":16,"block_n":32,"num_warps":4,"num_stages":3,"programs_per_sm":2}' \
            '{"block_h":16,"block_n":64,"num_warps":4,"num_stages":2,"programs_per_sm":2}' \
            '{"block_h":32,"block_n":32,"num_warps":4,"num_stages":3,"programs_per_sm":1}' \
            '{"block_h":64,"block_n":64,"num_warps":8,"num_stages":2,"split_tokens":256}' \
            '{"block_h":64,"block_n":32,"num_warps":4,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":16,"block_n":128,"num_warps":4,"num_stages":2,"programs_per_sm":1}' \
            '{"block_h":32,"block_n":64,"num_warps":8,"num_stages":2,"programs_per_sm":2}'
        bench_best mla_decode triton_mla_decode.py b1 b1-kv4096 b1-kv32768
        ;;
    mla_gluon)
        # The Gluon candidate (two warpgroups, each owning half the output's columns, and a TMA
        # loader warp) swept against torch.compile at batch 1 (the DeepSeek block's sizes) and
        # the batched shapes; the fastest at each then against every peer. Its configurations:
        # eager_values (the two warpgroups in turns, both computing every tile's scores; won
        # every shape in session 17, call 6, where the deferred order and 32-key tiles at 2
        # stages lost) and shared_p (each warpgroup computes every other tile's scores and
        # shares the probabilities) at the tiles and stages that fit shared memory.
        # MLA_GLUON_SHAPES and MLA_GLUON_CONFIGS (space-separated) narrow them.
        shapes=(b1-kv4096 b1-kv32768 b1-kv131072 b4-kv131072 b16-kv4096 b16-kv8192 b64-kv4096)
        configs=('{"eager_values":true}' '{"shared_p":true}'
            '{"block_n":32,"num_stages":4,"shared_p":true}'
            '{"block_n":32,"num_stages":3,"shared_p":true}')
        # shellcheck disable=SC2206
        [ -n "${MLA_GLUON_SHAPES:-}" ] && shapes=($MLA_GLUON_SHAPES)
        # shellcheck disable=SC2206
        [ -n "${MLA_GLUON_CONFIGS:-}" ] && configs=($MLA_GLUON_CONFIGS)
        listed=$(IFS=,; echo "${shapes[*]}")
        sweep mla_decode gluon_mla_decode.py gluon torch.compile "$listed" "${configs[@]}"
        bench_best mla_decode gluon_mla_decode.py gluon "${shapes[@]}"
        ;;
    mla_rows)
        # The split kernel with tokens as rows (scores as tokens x heads, the output as rank x
        # heads: the latent tile is the first operand of both products, the queries stay in
        # shared memory), at the builds that spill nothing on sm_90
        # (scripts/mla_sm90_resources.py), against the defaults (which spill 200 bytes a
        # thread) and two heads-as-rows builds that do not spill; then the fastest at each
        # decode size against every peer.
        sweep mla_decode triton_mla_decode.py rows eager b16-kv4096,b16-kv8192,b64-kv4096,b1-kv32768,b1-kv131072 \
            '{}' \
            '{"block_h":64,"block_n":16,"num_warps":8,"num_stages":2}' \
            '{"block_h":32,"block_n":32,"num_warps":8,"num_stages":2}' \
            '{"block_h":64,"block_n":32,"num_warps":8,"num_stages":2,"tokens_as_rows":true}' \
            '{"block_h":64,"block_n":16,"num_warps":8,"num_stages":2,"tokens_as_rows":true}' \
            '{"block_h":32,"block_n":32,"num_warps":8,"num_stages":2,"tokens_as_rows":true}' \
            '{"block_h":16,"block_n":64,"num_warps":8,"num_stages":2,"tokens_as_rows":true}'
        bench_best mla_decode triton_mla_decode.py rows b16-kv4096 b16-kv8192 b1-kv32768
        ;;
    prefill_attention)
        # The Gluon candidate (its defaults won the prefill_gluon sweep, session 17) at every
        # shape against SDPA pinned to its two fastest backends: eager is SDPA's own pick among
        # them, and torch.compile compiles that same call (the long shapes' float64 reference
        # alone takes seconds, so fewer runners keep the call under its cap). Its grid runs a
        # head's query blocks together, which share K and V in L2: heads fastest measured 0.925x
        # cuDNN at 64k against 1.032x (session 17). PREFILL_SHAPES (space-separated) narrows
        # the shapes.
        shapes=(b8-q1024-kv1024 b1-q4096-kv4096 b1-q8192-kv8192 b1-q16384-kv16384
            b1-q32768-kv32768 b1-q65536-kv65536 b1-q8192-kv131072)
        # shellcheck disable=SC2206
        [ -n "${PREFILL_SHAPES:-}" ] && shapes=($PREFILL_SHAPES)
        bench prefill_attention gluon_prefill_attention.py default '{}' \
            "--peer sdpa-flash --peer sdpa-cudnn" "${shapes[@]}"
        ;;
    prefill_desc)
        # The defaults (descriptor loads, 128x128 tiles, 8 warps, 3 stages) against programs of
        # one warpgroup owning 128 rows, two to an SM (built for sm_90 with the device's Triton
        # 3.6: 128x64 at 2 stages, 255 registers and 104 bytes spilled, 98 KB; 128x32 at 3
        # stages, 230 registers, 82 KB) and the best of session 15's other tries, swept at 16k
        # against SDPA's cuDNN backend (the 16k ratios ranked the configs as the 64k ones did,
        # session 15 call 1); the winner then at 8k and 64k against both SDPA backends. Lost in
        # session 15: 256-row tiles over 16 warps (0.67-0.80x) and lag_pv (0.68-0.80x against
        # 0.875x; commit 4b1e15d, dropped: ptxas waits before its softmax all the same).
        sweep prefill_attention triton_prefill_attention.py desc sdpa-cudnn b1-q16384-kv16384 \
            '{}' \
            '{"num_warps":4,"block_n":64,"num_stages":2}' \
            '{"num_warps":4,"block_n":32,"num_stages":3}' \
            '{"block_n":64,"num_stages":2,"max_registers":128}' \
            '{"block_m":64,"block_n":64,"num_warps":4,"num_stages":3}'
        [ -z "${NO_SWEEP:-}" ] &&
            best=$(python3 scripts/sweep_best.py "$DIR/prefill_attention-desc.json" b1-q16384-kv16384) &&
            bench prefill_attention triton_prefill_attention.py descbest "$best" \
                "--peer sdpa-flash --peer sdpa-cudnn" b1-q8192-kv8192 b1-q65536-kv65536
        ;;
    prefill_gluon)
        # The Gluon candidate (flash attention 3's ping-pong: two warpgroups of 64 query rows
        # take turns at the tensor cores, so one's softmax runs under the other's products; a
        # loader warp feeds both by TMA), with and without pairs (two unmasked tiles an
        # iteration, the second's Q K^T in flight over the first's softmax in the machine code).
        # Its configurations that fit shared memory, swept at 16k against SDPA's cuDNN backend;
        # the winner then at 8k and 64k against both backends.
        sweep prefill_attention gluon_prefill_attention.py gluon sdpa-cudnn b1-q16384-kv16384 \
            '{}' '{"num_stages":3}' '{"block_n":64,"num_stages":2}' '{"block_n":64,"num_stages":4}' \
            '{"block_n":64,"num_stages":4,"pairs":true}' '{"block_n":64,"num_stages":3,"pairs":true}'
        [ -z "${NO_SWEEP:-}" ] &&
            best=$(python3 scripts/sweep_best.py "$DIR/prefill_attention-gluon.json" b1-q16384-kv16384) &&
            bench prefill_attention gluon_prefill_attention.py gluonbest "$best" \
                "--peer sdpa-flash --peer sdpa-cudnn" b1-q8192-kv8192 b1-q65536-kv65536
        ;;
    prefill_mla)
        # DeepSeek's prefill in the expanded form (the mla_prefill_attention task: 128 heads, q
        # and k 192 wide, 128 nope + 64 rope, v 128) by the Triton candidate, whose scores are
        # two products. 192-wide K tiles take shared memory: 128x128 tiles fit 2 stages
        # (209 KB), 128x64 3 (169 KB); every configuration here builds for sm_90 with no spill
        # (scripts/prefill_sm90_schedule.py --mla). Swept at the 4k chunk of a 32k prompt
        # against eager (SDPA's own pick: its flash backend cannot take a narrower v), the
        # winner then at every shape against eager, SDPA's cuDNN backend and torch.compile.
        sweep mla_prefill_attention triton_mla_prefill_attention.py sweep eager b1-q4096-kv32768 \
            '{"block_n":64,"num_stages":2}' '{"block_n":64,"num_stages":3}' \
            '{"block_n":128,"num_stages":2}' '{"block_n":32,"num_stages":3}' \
            '{"block_m":64,"block_n":64,"num_warps":4,"num_stages":3}' \
            '{"block_n":64,"num_stages":2,"loads":"pointer"}'
        [ -z "${NO_SWEEP:-}" ] &&
            best=$(python3 scripts/sweep_best.py "$DIR/mla_prefill_attention-sweep.json" b1-q4096-kv32768) &&
            bench mla_prefill_attention triton_mla_prefill_attention.py best "$best" \
                "--peer eager --peer sdpa-cudnn --peer torch.compile" b1-q4096-kv4096 \
                b1-q4096-kv32768 b1-q8192-kv65536
        ;;
    fp8_gemm)
        # Peers: eager (dequantise, then bf16 F.linear) and scaled-mm (cuBLASLt fp8).
        bench fp8_gemm triton_fp8_gemm.py default '{}' "--peer eager --peer scaled-mm" \
            tensor-m1-n8192-k8192 tensor-m16-n4096-k14336 tensor-m128-n8192-k8192 \
            tensor-m4096-n8192-k8192 block-m1-n7168-k18432 block-m16-n18432-k7168 \
            block-m128-n18432-k7168 block-m4096-n18432-k7168
        ;;
    *) echo "unknown stage $stage" >&2 ;;
    esac
done

python3 - "$DIR" <<'PY'
"""One line per (run, shape): candidate time, rate, best peer and the speedup interval."""
import json, sys
from pathlib import Path
from loop.tasks import load_task

def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def sweep_summary(path, data, task, shapes):
    peer = next(v for v in data["verdicts"] if v["kind"] == "peer")
    print(f"== {path.stem}: configs against {peer['label']} (ratio = peer time / config time)")
    for v in data["verdicts"]:
        if v["kind"] == "peer":
            continue
        bad = [r["code"] + ": " + r["message"][:100] for r in v["reasons"]]
        cells = []
        for name, res in v["shapes"].items():
            t, p = median(res.get("blocks_s", [])), median(peer["shapes"].get(name, {}).get("blocks_s", []))
            if t:
                gbs = task.bytes_moved(shapes[name]) / t / 1e12
                tf = task.flops(shapes[name]) / t / 1e12
                cells.append(f"{name} {t * 1e6:.1f}us {gbs:.2f}TB/s {tf:.0f}TF x{(p or 0) / t:.3f}")
        other = v["label"].rpartition(":")[0]  # a config of another candidate file
        print(f"   {other + ' ' if other else ''}{json.dumps(v['params'])} {v['verdict']} {bad or ''}")
        for c in cells:
            print(f"      {c}")


tasks = {}
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        print(f"{path.name}: no JSON (see {path.with_suffix('.err').name})")
        continue
    task = tasks.setdefault(data["task"], load_task(data["task"]))
    shapes = {s.name: s for dev in ("cuda", "cpu") for s in task.shapes(dev)}
    if data.get("sweep"):
        sweep_summary(path, data, task, shapes)
        continue
    bad = [r["code"] + ": " + r["message"][:120] for r in data.get("reasons", [])]
    print(f"== {path.stem} params={json.dumps(data.get('params'))} {data['verdict']} {bad or ''}")
    for pv in data.get("peer_verdicts", []):
        if pv["reasons"]:
            print(f"   peer {pv['label']} rejected: {pv['reasons'][0]['message'][:140]}")
    for row in data.get("table", []):
        t = row.get("candidate_s")
        if not t:
            continue
        shape = shapes[row["shape"]]
        rate = (f"{task.bytes_moved(shape) / t / 1e12:.2f} TB/s "
                f"{task.flops(shape) / t / 1e12:.0f} TFLOP/s")
        peers = " ".join(f"{k}={v * 1e6:.1f}us" for k, v in row["peers"].items() if v)
        sp = row.get("speedup_vs_best_peer")
        ratio = f"{sp['ratio']:.3f}x [{sp['ci_low']:.3f},{sp['ci_high']:.3f}] vs {row['best_peer']}" if sp else "-"
        print(f"   {row['shape']:22s} {t * 1e6:9.1f}us {rate:28s} {ratio} | {peers}")
PY

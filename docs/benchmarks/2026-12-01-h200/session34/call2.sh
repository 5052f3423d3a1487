# Session 34 call 2: the decode blocks on session 25's tables, and benches of the current
# cross-entropy and MLA prefill files. R: the output folder.
T=docs/benchmarks/2026-12-01-h200/session25/variant-b16-downs-late
timeout 130 python3 scripts/bench_e2e_block.py --dispatch-dir $T --kinds llama \
    --sizes decode:1:4096,decode:16:4096 --layers 4 --json $R/e2e.json 2>&1 | tee $R/e2e.log | grep -v "^  " | tail -6
timeout 130 python3 scripts/bench_e2e_block.py --dispatch-dir $T --kinds mla \
    --sizes decode:1:32768,decode:16:4096 --layers 4 --json $R/e2e2.json 2>&1 | tee $R/e2e2.log | grep -v "^  " | tail -6
bench() {  # NAME TIMEOUT TASK CANDIDATE PARAMS ARGS...
    local name=$1 limit=$2 task=$3 cand=$4 params=$5
    shift 5
    timeout "$limit" python3 -m appliance bench "$task" "$cand" --params "$params" "$@" --json \
        > "$R/bench-$name.json" 2> "$R/bench-$name.err"
    echo "bench-$name rc=$?"
    [ -s "$R/bench-$name.err" ] || rm -f "$R/bench-$name.err"
}
CE='"warp_pairs":true,"async_pairs":true,"redux_max":true'
CEP="--peer eager --peer torch.compile --peer torch.compile-dynamic"
bench ce32k 60 cross_entropy cupy_cross_entropy_resident.py "{\"threads\":256,\"slice_kb\":8,$CE}" $CEP --shape decode-64x32000
bench ce128k 60 cross_entropy cupy_cross_entropy_resident.py "{\"threads\":512,\"slice_kb\":16,$CE}" $CEP --shape decode-64x128256
M='{"block_n":128,"num_stages":2}'
bench mla4k 60 mla_prefill_attention triton_mla_prefill_attention.py "$M" --peer eager --peer sdpa-cudnn --peer torch.compile --shape b1-q4096-kv4096
bench mla64k 90 mla_prefill_attention triton_mla_prefill_attention.py "$M" --peer sdpa-cudnn --shape b1-q8192-kv65536
for f in $R/bench-*.json; do
    python3 -c "import json;d=json.load(open('$f'));t=d['table'][0];print(t['shape'],d['verdict'],round(t['candidate_s']*1e6,2),{k:round(v*1e6,2) for k,v in t['peers'].items()},t['speedup_vs_best_peer'])" || echo "$f: no table"
done

#!/usr/bin/env bash
# Peer-to-peer baselines and the all-reduce task on a machine with 2+ GPUs of one host.
# Usage: scripts/bench_allreduce_gpu.sh [OUT_DIR]   (default docs/benchmarks/allreduce-<date>)
# NVLink multicast stays off here and in every rank (baselines.multiprocess forces it too).
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
OUT="${1:-docs/benchmarks/allreduce-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if command -v uv >/dev/null 2>&1 && [ -f uv.lock ] && [ -z "${PYTHON:-}" ]; then PY="uv run python"; fi

$PY -c 'import torch; n = torch.cuda.device_count(); print("GPUs:", n); assert n >= 2, "needs 2+ GPUs"' \
  | tee "$OUT/gpus.txt"
nvidia-smi topo -m > "$OUT/nvidia-smi-topo.txt" 2>&1 || true
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from baselines.p2p import run_p2p_suite
from loop.distributed import run_distributed_task

out = Path(sys.argv[1])
p2p = run_p2p_suite(quick=False, progress=print)
(out / "p2p.json").write_text(json.dumps(p2p.to_dict(), indent=2))
for pair in p2p.pairs:
    print(pair.src, "->", pair.dst, {m.name: round(m.value, 2) for m in pair.metrics}, pair.notes)
for p in p2p.allreduce:
    print(f"all-reduce {p.nbytes:>11} B  {p.time_us.value:9.2f} us  busbw {p.busbw_gbps:8.2f} GB/s")
task = run_distributed_task("allreduce", device="cuda", blocks=15)
(out / "allreduce-task.json").write_text(json.dumps(task.to_dict(), indent=2))
(out / "allreduce-dispatch.json").write_text(json.dumps(task.dispatch, indent=2))
for e in task.entries:
    s = f"{e.speedup:.2f}x [{e.speedup_ci[0]:.2f}, {e.speedup_ci[1]:.2f}]" if e.speedup else "-"
    t = f"{e.time_us:9.2f} us" if e.time_us else "      -     "
    print(f"{e.shape:>20} {e.name:>24} {'ok' if e.ok else 'REJECTED'} {t} {s} {e.reason}")
PY
$PY -m pytest -q tests/baselines/test_p2p.py tests/kernels/test_allreduce.py \
  tests/host_tuning/test_topology.py 2>&1 | tee "$OUT/pytest.txt"
echo "results in $OUT"

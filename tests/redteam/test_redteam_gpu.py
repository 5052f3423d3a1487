"""Red-team suite, GPU part (issue 3): REWARD_HACKS.md entries that only exist on a GPU (side
streams, persisting L2, graph breaks, uninitialised device memory, caches under graph replay,
device memory exhaustion), each through the public `autotune verify`/`bench` commands against
RMSNorm, with the reason code asserted. Run on the H200: `uv run pytest -m gpu tests/redteam`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loop.evaluator import CandidateSpec, Limits, evaluate
from loop.tasks import load_task

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent / "candidates_gpu"
ROOT = Path(__file__).resolve().parents[2]
BIG = "prefill-4096x4096"  # large enough that an empty graph is under the physics floor
SMALL = "decode-16x4096"

# entry -> (candidate, command, expected codes: any of them). A graph holding no kernel at all is
# timed under the physics floor; should the driver refuse to capture an empty graph, that is a
# capture failure, also a rejection of the trick.
CASES = {
    "3-side-stream": ("side_stream.py", "verify", {"forbidden-call"}),
    "17-persisting-l2-window": ("persisting_l2.py", "verify", {"forbidden-call"}),
    "14-item-host-sync": ("graph_break_item.py", "verify", {"graph-capture-failed"}),
    "14-host-round-trip": ("graph_break_host_copy.py", "verify", {"graph-capture-failed"}),
    "1-19-uninitialised-empty": (
        "uninitialised_empty.py",
        "verify",
        {"non-finite-output", "constant-output", "mismatch"},
    ),
    "7-19-empty-after-warmup": (
        "empty_after_warmup.py",
        "bench",
        {"faster-than-physics", "reverify-mismatch", "graph-capture-failed"},
    ),
    "6-cache-under-graph-replay": (
        "caches_by_pointer_gpu.py",
        "bench",
        {"faster-than-physics", "reverify-mismatch", "graph-capture-failed"},
    ),
    "7-one-buffer-for-every-capture": (
        "shares_output_across_captures.py",
        "bench",
        {"faster-than-physics", "reverify-mismatch"},
    ),
}


def run_cli(command: str, candidate: Path, *extra: str) -> dict:
    args = [sys.executable, "-m", "appliance", command, "rmsnorm", str(candidate)]
    args += ["--device", "cuda", "--json", *extra]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("entry", CASES)
def test_gpu_trick_is_rejected(entry: str) -> None:
    name, command, expected = CASES[entry]
    extra = ("--shape", BIG, "--peer", "eager") if command == "bench" else ()
    data = run_cli(command, HERE / name, *extra)
    assert data["verdict"] == "rejected", data
    got = {r["code"] for r in data["reasons"]}
    assert got & expected, data["reasons"]


def test_honest_triton_candidate_is_timed_under_graphs_with_rotated_inputs() -> None:
    task = load_task("rmsnorm")
    shapes = ("--shape", BIG, "--shape", SMALL)
    data = run_cli("bench", task.folder / "triton_rmsnorm.py", *shapes, "--peer", "eager")
    assert data["verdict"] == "accepted", data["reasons"]
    for shape in (BIG, SMALL):
        assert data["shapes"][shape]["method"] == "cuda-graph"
        assert data["shapes"][shape]["blocks_s"]
        assert data["shapes"][shape]["telemetry"]["blocks"] >= len(
            data["shapes"][shape]["blocks_s"]
        )


def test_gpu_deaths_cost_only_the_candidate_that_died() -> None:
    task = load_task("rmsnorm")
    specs = [
        CandidateSpec(HERE / "segfaults_gpu.py", {}, "segfault"),
        CandidateSpec(HERE / "eats_gpu_memory.py", {}, "hog"),
        CandidateSpec(task.folder / "triton_rmsnorm.py", {}, "honest"),
    ]
    ev = evaluate(
        task,
        specs,
        "cuda",
        time_it=True,
        peers=["eager"],
        shapes=[SMALL],
        limits=Limits(timeout_s=300, gpu_mem_fraction=0.25),
    )
    assert {r.code for r in ev.by_label("segfault").reasons} == {"crash"}
    assert {r.code for r in ev.by_label("hog").reasons} == {"out-of-memory"}
    for label in ("honest", "eager"):
        verdict = ev.by_label(label)
        assert verdict.accepted, verdict.reasons
        assert verdict.shapes[SMALL].blocks_s

"""Peer-to-peer baselines: sizes, bus bandwidth, rank combination, the launcher's environment,
and the all-reduce measurement through real gloo ranks on the CPU. GPU pairs need 2+ GPUs."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from baselines.multiprocess import SAFE_ENV, LaunchError, RankContext, child_env, launch
from baselines.p2p import (
    LocalResult,
    allreduce_sizes,
    bus_bandwidth,
    combine_ranks,
    measure_allreduce,
    physical_check,
    run_p2p_suite,
    short_error,
)
from baselines.suite import Metric

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def test_sizes_span_4k_to_1g() -> None:
    sizes = allreduce_sizes()
    assert sizes[0] == 4096 and sizes[-1] == 2**30
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert allreduce_sizes(factor=4)[-1] == 2**30
    with pytest.raises(ValueError, match="factor"):
        allreduce_sizes(factor=1)


def test_bus_bandwidth_is_nccl_tests_convention() -> None:
    assert bus_bandwidth(1000, 1.0, 2) == pytest.approx(1000)
    assert bus_bandwidth(1000, 1.0, 8) == pytest.approx(1750)


def test_a_collective_block_is_the_slowest_rank() -> None:
    assert combine_ranks([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]


def _m(name: str, unit: str, value: float) -> Metric:
    return Metric(name, unit, value, value, value, 5, unit == "GB/s", f"{name} 0->1")


def _local(device: int, ce_bw: float, sm_bw: float, ce_us: float, sm_us: float) -> LocalResult:
    return LocalResult(
        device,
        [
            _m("ce_bandwidth", "GB/s", ce_bw),
            _m("sm_bandwidth", "GB/s", sm_bw),
            _m("ce_latency", "us", ce_us),
            _m("sm_latency", "us", sm_us),
        ],
    )


def test_physical_check_drops_figures_no_link_can_produce() -> None:
    src, dst = _local(0, 1800.0, 2400.0, 6.0, 1.0), _local(1, 1700.0, 2300.0, 7.0, 1.1)
    measured = [
        _m("ce_bandwidth", "GB/s", 365.0),
        _m("sm_pull_bandwidth", "GB/s", 90200.0),  # the first H200 run's timing fault
        _m("sm_push_bandwidth", "GB/s", 370.0),
        _m("ce_latency", "us", 18.0),
        _m("sm_latency", "us", 0.06),
    ]
    kept, notes = physical_check(measured, src, dst)
    assert [m.name for m in kept] == ["ce_bandwidth", "sm_push_bandwidth", "ce_latency"]
    assert len(notes) == 2
    assert "sm_pull_bandwidth" in notes[0] and "2400 GB/s" in notes[0]
    assert "sm_latency" in notes[1] and "not reported" in notes[1]
    assert all("\n" not in n for n in notes)


def test_physical_check_without_local_figures_keeps_everything() -> None:
    measured = [_m("sm_pull_bandwidth", "GB/s", 90200.0), _m("sm_latency", "us", 0.06)]
    kept, notes = physical_check(measured, LocalResult(0, []), LocalResult(1, []))
    assert kept == measured and notes == []


def test_host_clock_local_figures_are_no_bound() -> None:
    slow = _local(0, 1800.0, 2400.0, 6.0, 20.0)
    timed_on_host = LocalResult(0, slow.metrics, host_clock=["sm_latency"])
    measured = [_m("sm_latency", "us", 1.2)]
    assert physical_check(measured, slow, slow)[0] == []
    assert physical_check(measured, timed_on_host, timed_on_host) == (measured, [])


def test_short_error_is_one_line_with_the_cuda_error_name() -> None:
    message = (
        "CUDA error: operation failed due to a previous error during capture\n"
        "Search for `cudaErrorStreamCaptureInvalidated' in https://docs.nvidia.com/cuda/...\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    )
    line = short_error(RuntimeError(message))
    assert "\n" not in line and len(line) <= 160
    assert line.startswith("RuntimeError: CUDA error: operation failed")
    assert "cudaErrorStreamCaptureInvalidated" in line
    assert short_error(ValueError()) == "ValueError"
    assert len(short_error(ValueError("x" * 500))) == 160


def test_child_env_forces_multicast_off_and_sets_ranks() -> None:
    env = child_env(1, 3, {"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert {k: env[k] for k in SAFE_ENV} == SAFE_ENV
    assert (env["RANK"], env["WORLD_SIZE"], env["PATH"]) == ("1", "3", "/bin")


def env_probe(ctx: RankContext) -> dict:
    """Rank function: the multicast variables in this rank and in a process it starts."""
    names = list(SAFE_ENV)
    code = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return {
        "rank": ctx.rank,
        "mine": {k: os.environ.get(k) for k in SAFE_ENV},
        "child": child.stdout,
    }


def fail_on_rank_one(ctx: RankContext) -> int:
    if ctx.rank == 1:
        raise RuntimeError("planted failure")
    return ctx.rank


def test_ranks_and_their_children_keep_multicast_off(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    results = launch("tests.baselines.test_p2p:env_probe", 2, backend="gloo", timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["mine"] == SAFE_ENV
        assert json.loads(r["child"]) == SAFE_ENV


def test_a_failing_rank_is_named_and_the_rest_stopped() -> None:
    with pytest.raises(LaunchError, match=r"rank 1.*planted failure"):
        launch("tests.baselines.test_p2p:fail_on_rank_one", 2, backend="gloo", timeout_s=120)


def test_bad_launch_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="target"):
        launch("no_colon", 2, backend="gloo")
    with pytest.raises(ValueError, match="backend"):
        launch("a:b", 2, backend="mpi")
    if not TWO_GPUS:
        with pytest.raises(ValueError, match="GPUs for nccl"):
            launch("a:b", 2, backend="nccl")


def test_allreduce_through_gloo_ranks() -> None:
    points = measure_allreduce(2, [4096, 65536], backend="gloo", quick=True, timeout_s=120)
    assert [p.nbytes for p in points] == [4096, 65536]
    for p in points:
        assert p.time_us.ci_low <= p.time_us.value <= p.time_us.ci_high
        seconds = p.time_us.value / 1e6
        assert p.busbw_gbps == pytest.approx(bus_bandwidth(p.nbytes, seconds, 2) / 1e9)
        json.dumps(p.to_dict())


@pytest.mark.skipif(TWO_GPUS, reason="checks the fewer-than-two-GPUs answer")
def test_suite_without_two_gpus_says_why() -> None:
    result = run_p2p_suite(quick=True)
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["pairs"] == [] and doc["allreduce"] == []
    assert any("two or more GPUs" in n for n in doc["notes"])
    assert "matrix" in doc["topology"]


@pytest.mark.gpu
@pytest.mark.skipif(not TWO_GPUS, reason="needs 2+ GPUs")
def test_suite_on_two_gpus() -> None:
    result = run_p2p_suite(quick=True, devices=[0, 1], sizes=[4096, 2**20])
    assert {(p.src, p.dst) for p in result.pairs} == {(0, 1), (1, 0)}
    assert {r.device for r in result.local} == {0, 1}
    for pair in result.pairs:
        names = {m.name for m in pair.metrics}
        assert {"ce_bandwidth", "ce_latency"} <= names, pair.notes
        if pair.peer_access:
            assert {"sm_pull_bandwidth", "sm_push_bandwidth", "sm_latency"} <= names, pair.notes
        assert not any("not physical" in n for n in pair.notes), pair.notes
        assert not any(n.startswith("sm_") and "host clock" in n for n in pair.notes)
        assert all("\n" not in n for n in pair.notes), pair.notes
    assert [p.nbytes for p in result.allreduce] == [4096, 2**20]
    assert all(p.busbw_gbps > 0 for p in result.allreduce)

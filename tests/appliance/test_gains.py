"""Gains measured with host states interleaved: the profile goes to the simulated NVML device
before each tuned block and comes off after it, also when the block fails or is signalled, and
the ratios come out with intervals in the shape the report schema asks for."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from appliance.gains import (
    DISPATCH,
    PEER,
    STOCK,
    TUNED,
    Rounds,
    StateSample,
    Workload,
    gain_ratio,
    gains_block,
    interleave_host_states,
    paired_blocks,
)
from appliance.output import UsageFailure
from appliance.tuned_host import (
    SIM_STATE_NAME,
    TunedHost,
    TuningRefused,
    hold_profile,
    journal_closed,
    open_tuned_host,
    plan_changes,
    profile_report,
    run_preflight,
)
from host_tuning.apply import ApplyInterrupted, PersistentSimulatedNvml, apply_profile
from host_tuning.journal import read_journal
from host_tuning.nvml_base import DEVICE_FIELDS
from host_tuning.nvml_sim import SimulatedNvml

SCHEMA = Path(__file__).parents[2] / "appliance/report/schemas/report-v2.schema.json"
FIXTURE = "rtx4090-consumer"  # persistence off, power limit below max, offsets allowed


def device_state(device) -> dict:
    """Everything the device answers, and its clock locks (NVML has no getter for those)."""
    fields = {f: device.read(0, f).value for f in DEVICE_FIELDS}
    return {"fields": fields, "locks": device.locked_clocks(0)}


def replayed(host: TunedHost, fixture: str = FIXTURE) -> dict:
    """The device as a new process would see it: the fixture with the state file replayed."""
    return device_state(PersistentSimulatedNvml(fixture, host.journal.parent / SIM_STATE_NAME))


def original(fixture: str = FIXTURE) -> dict:
    return device_state(SimulatedNvml.from_fixture(fixture))


def timed_blocks(n: int, work: int) -> list[float]:
    """Real block times of a small computation."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        sum(range(work))
        out.append(time.perf_counter() - start)
    return out


def sample() -> StateSample:
    return StateSample(
        {
            "t/a": {DISPATCH: timed_blocks(4, 2000), PEER: timed_blocks(4, 4000)},
            "t/b": {DISPATCH: timed_blocks(3, 1000), PEER: timed_blocks(3, 3000)},
        }
    )


def test_each_tuned_block_runs_under_the_profile_and_the_stock_ones_without(
    tmp_path: Path,
) -> None:
    host = open_tuned_host("max", FIXTURE, tmp_path)
    planned = {c.setting: c.after for c in plan_changes(host) if c.status == "planned"}
    assert planned, "max changes the rtx4090 fixture"
    seen = []

    def measure(state: str, r: int) -> StateSample:
        backend = host.backend
        seen.append(
            (
                state,
                r,
                backend.read(0, "power_limit_mw").value,
                backend.locked_clocks(0),
                journal_closed(host),
            )
        )
        return sample()

    rounds = interleave_host_states(measure, lambda: hold_profile(host), 2)
    assert [(s, r) for s, r, *_ in seen] == [(STOCK, 1), (TUNED, 1), (STOCK, 2), (TUNED, 2)]
    stock_power = original()["fields"]["power_limit_mw"]
    for state, _, power, locks, closed in seen:
        if state == STOCK:
            assert power == stock_power and locks == {} and closed
        else:
            assert power == planned["gpu0.power_limit_w"] * 1000 and not closed
            assert locks["gpu"] == tuple(planned["gpu0.locked_clocks_mhz"])
    assert len(rounds) == 2 and host.blocks == 2
    assert journal_closed(host) and replayed(host) == original()
    report = profile_report(host, [])
    assert report["mode"] == "applied" and report["restored"] is True
    assert report["nvml"] == f"simulated: {FIXTURE}" and report["restore_errors"] == []
    applied = {c["setting"] for c in report["changes"] if c["status"] == "applied"}
    assert applied == set(planned)


def test_a_failure_in_the_middle_of_a_tuned_block_still_restores(tmp_path: Path) -> None:
    host = open_tuned_host("overclock", FIXTURE, tmp_path)

    def measure(state: str, r: int) -> StateSample:
        if state == TUNED and r == 2:
            assert host.backend.read(0, "gpc_clk_vf_offset_mhz").value != 0
            raise RuntimeError("the worker died")
        return sample()

    with pytest.raises(RuntimeError, match="the worker died"):
        interleave_host_states(measure, lambda: hold_profile(host), 3)
    journal = read_journal(host.journal)
    assert journal.closed and not journal.pending
    assert replayed(host) == original()
    assert profile_report(host, [])["restored"] is True


def test_sigterm_during_a_tuned_block_restores_before_it_ends_the_run(tmp_path: Path) -> None:
    host = open_tuned_host("max", FIXTURE, tmp_path)

    def measure(state: str, r: int) -> StateSample:
        if state == TUNED:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal arrives well before this ends
        return sample()

    with pytest.raises(ApplyInterrupted) as caught:
        interleave_host_states(measure, lambda: hold_profile(host), 2)
    assert caught.value.signum == signal.SIGTERM and caught.value.exit_code == 143
    assert journal_closed(host) and replayed(host) == original()


def test_preflight_refuses_a_busy_gpu_and_only_warns_about_what_the_profile_fixes(
    tmp_path: Path,
) -> None:
    host = open_tuned_host("stable", FIXTURE, tmp_path)
    result = run_preflight(host)
    assert not result.refused
    assert "persistence_off" in {f.code for f in result.findings if f.severity == "warn"}
    host.backend = PersistentSimulatedNvml(
        FIXTURE, tmp_path / "busy.jsonl", overrides={"compute_processes": [os.getpid() + 1]}
    )
    busy = run_preflight(host)
    assert busy.refused and any(f.code == "other_processes" for f in busy.findings)


def test_applying_refuses_clearly_before_anything_runs(tmp_path: Path) -> None:
    from host_tuning.nvml import probe_nvml

    if os.geteuid() != 0 or probe_nvml().backend is None:  # never open the real GPU to write
        with pytest.raises(TuningRefused, match="--simulate"):
            open_tuned_host("stable", None, tmp_path)
    with pytest.raises(UsageFailure, match="--simulate: unknown fixture 'a100'"):
        open_tuned_host("stable", "a100", tmp_path)
    with pytest.raises(UsageFailure, match="unknown profile"):
        open_tuned_host("fastest", "h200", tmp_path)


def test_a_journal_left_open_by_an_earlier_run_refuses_the_next(tmp_path: Path) -> None:
    host = open_tuned_host("max", FIXTURE, tmp_path)
    apply_profile(host.profile, host.backend, host.journal, cpu_root=host.cpu_root)
    with pytest.raises(TuningRefused, match="--restore"):
        open_tuned_host("max", FIXTURE, tmp_path)


def _rounds(blocks: list[dict[str, dict[str, dict[str, list[float]]]]]) -> Rounds:
    return Rounds([{state: StateSample(k) for state, k in r.items()} for r in blocks])


def test_blocks_pair_by_round_and_position() -> None:
    rounds = _rounds(
        [
            {STOCK: {"x": {PEER: [4.0, 4.0, 9.0]}}, TUNED: {"x": {DISPATCH: [2.0, 2.0]}}},
            {STOCK: {"x": {PEER: [6.0]}}, TUNED: {"x": {DISPATCH: [3.0, 1.0]}}},
        ]
    )
    assert paired_blocks(rounds, (STOCK, PEER), (TUNED, DISPATCH)) == {
        "x": ([4.0, 4.0, 6.0], [2.0, 2.0, 3.0])
    }
    ratio = gain_ratio(rounds, (STOCK, PEER), (TUNED, DISPATCH), Workload({"x": 1.0}, "x"))
    assert ratio["ratio"] == pytest.approx(4.0 / 2.0)
    assert ratio["ci_low"] <= ratio["ratio"] <= ratio["ci_high"] and ratio["n_blocks"] == 3


def test_the_gains_block_is_what_the_schema_asks_for() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = Draft202012Validator({"$ref": "#/$defs/gains", "$defs": schema["$defs"]})
    rounds = Rounds([{STOCK: sample(), TUNED: sample()} for _ in range(2)])
    workload = Workload({"t/a": 0.75, "t/b": 0.25}, "two points")
    block = gains_block(rounds, workload, tuned_host="profile max", notes=["simulated"])
    assert list(validator.iter_errors(block)) == []
    e2e = block["end_to_end"]
    assert e2e["kernel_only"] == {k: block["kernel"][k] for k in e2e["kernel_only"]}
    assert e2e["hardware_only"] == {k: block["hardware"][k] for k in e2e["hardware_only"]}
    combined = gain_ratio(rounds, (STOCK, PEER), (TUNED, DISPATCH), workload)
    assert e2e["combined"] == combined  # measured directly, not a product of the other two
    for gain in (block["hardware"], block["kernel"], e2e["combined"]):
        assert 0 < gain["ci_low"] <= gain["ratio"] <= gain["ci_high"]
    assert block["hardware"]["notes"][0] == "simulated" and block["hardware"]["rounds"] == 2

"""The NVML sampler, block summaries and the re-measure hook, on the simulated device."""

from __future__ import annotations

import time

import pytest

from baselines.telemetry import (
    BlockRecord,
    TelemetrySampler,
    block_is_clean,
    clean_block_hook,
    nvml_index_for,
    summarize_records,
)
from baselines.timer import StoppingRule, cpu_block, run_interleaved
from host_tuning.nvml import SimulatedNvml, decode_clock_event_reasons

THERMAL = 0x20  # sw_thermal_slowdown
POWER_CAP = 0x4  # sw_power_cap
RULE = StoppingRule(samples_per_block=3, min_blocks=4, max_blocks=4, max_time_s=5.0, warmup=1)


@pytest.fixture
def sim() -> SimulatedNvml:
    return SimulatedNvml.from_fixture("h200-passthrough-vm")


def recorded(sim: SimulatedNvml, field: str):
    return sim.read(0, field).value


def test_sampler_collects_in_the_background(sim: SimulatedNvml) -> None:
    with TelemetrySampler(sim, 0, period_s=0.005) as sampler:
        time.sleep(0.1)
        block = sampler.take()
    rest = sampler.take()  # the thread is joined: what it read after the first take is here
    assert block.samples >= 2  # the thread sampled, and take() added one
    assert sampler.sample_count == block.samples + rest.samples
    assert block.sm_clock_min_mhz == recorded(sim, "clock_sm_current_mhz")
    assert block.mem_clock_median_mhz == recorded(sim, "clock_memory_current_mhz")
    assert block.max_temperature_c == recorded(sim, "temperature_c")
    assert block.max_power_w == pytest.approx(recorded(sim, "power_usage_mw") / 1000)
    assert block.reasons == decode_clock_event_reasons(recorded(sim, "clock_event_reasons_current"))
    assert not block.slowdown


def test_take_splits_windows_and_sees_a_throttle(sim: SimulatedNvml) -> None:
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        first = sampler.take()
        sim.set_field(0, "clock_event_reasons_current", THERMAL)
        sim.set_field(0, "clock_sm_current_mhz", 1200)
        sim.set_field(0, "temperature_c", 91)
        second = sampler.take()
    assert not first.thermal_slowdown
    assert second.samples == 1  # only this window's read, not the first window's
    assert second.thermal_slowdown and not second.power_slowdown
    assert second.sm_clock_min_mhz == 1200
    assert second.max_temperature_c == 91
    assert "sw_thermal_slowdown" in second.reasons
    assert not block_is_clean(second, median_clock=1200)


def test_power_cap_is_a_slowdown(sim: SimulatedNvml) -> None:
    sim.set_field(0, "clock_event_reasons_current", POWER_CAP)
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        block = sampler.take()
    assert block.power_slowdown
    assert not block_is_clean(block, median_clock=None)


def test_clock_drop_threshold(sim: SimulatedNvml) -> None:
    sim.set_field(0, "clock_event_reasons_current", 0)
    sim.set_field(0, "clock_sm_current_mhz", 1800)
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        block = sampler.take()
    assert block_is_clean(block, median_clock=1800)
    assert not block_is_clean(block, median_clock=1980, max_drop=0.05)  # 9 % under
    assert block_is_clean(block, median_clock=1980, max_drop=0.10)


def throttling_runner(sim: SimulatedNvml, throttle_on_call: int, field: str, bad, good):
    """A CPU runner that makes the simulated GPU misbehave during one of its calls."""
    calls = []

    def run(n: int) -> list[float]:
        calls.append(n)
        sim.set_field(0, field, bad if len(calls) == throttle_on_call else good)
        return cpu_block(lambda: sum(range(1000)), n)

    return run, calls


def test_hook_has_a_throttled_block_measured_again(sim: SimulatedNvml) -> None:
    # call 1 is the warm-up, call 2 the first block: thermal slowdown there, clean afterwards
    run, calls = throttling_runner(sim, 2, "clock_event_reasons_current", THERMAL, 0)
    log: list[BlockRecord] = []
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        medians = run_interleaved([run], RULE, on_block=clean_block_hook(sampler, log))
    assert len(medians[0]) == RULE.max_blocks
    assert len(calls) == 1 + RULE.max_blocks + 1  # warm-up, the blocks, one re-measure
    assert [(r.block, r.clean) for r in log[:2]] == [(0, False), (0, True)]
    assert log[0].telemetry.thermal_slowdown
    summary = summarize_records(log)
    assert summary["blocks"] == RULE.max_blocks
    assert summary["remeasured_blocks"] == 1
    assert summary["unclean_blocks_kept"] == 0
    assert summary["thermal_slowdown_blocks"] == 1
    assert "sw_thermal_slowdown" in summary["reasons"]


def test_hook_catches_a_clock_dip(sim: SimulatedNvml) -> None:
    sim.set_field(0, "clock_event_reasons_current", 0)
    # blocks 0 and 1 at 1980 MHz, then block 2 (call 4) dips to 1500 MHz
    run, calls = throttling_runner(sim, 4, "clock_sm_current_mhz", 1500, 1980)
    log: list[BlockRecord] = []
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        run_interleaved([run], RULE, on_block=clean_block_hook(sampler, log))
    dips = [r for r in log if not r.clean]
    assert [(r.block, r.telemetry.sm_clock_min_mhz) for r in dips] == [(2, 1500)]
    assert len(calls) == 1 + RULE.max_blocks + 1
    assert summarize_records(log)["remeasured_blocks"] == 1


def test_a_block_that_stays_throttled_is_kept_after_the_retries(sim: SimulatedNvml) -> None:
    sim.set_field(0, "clock_event_reasons_current", POWER_CAP)
    log: list[BlockRecord] = []
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        medians = run_interleaved(
            [lambda n: cpu_block(lambda: None, n)], RULE, on_block=clean_block_hook(sampler, log)
        )
    assert len(medians[0]) == RULE.max_blocks
    summary = summarize_records(log)
    assert summary["unclean_blocks_kept"] == RULE.max_blocks
    assert summary["remeasured_blocks"] == 2 * RULE.max_blocks  # the timer retries twice


def test_work_meant_for_the_power_limit_is_not_measured_again_for_it(sim: SimulatedNvml) -> None:
    sim.set_field(0, "clock_event_reasons_current", POWER_CAP)
    log: list[BlockRecord] = []
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        hook = clean_block_hook(sampler, log, power_is_steady=True)
        run_interleaved([lambda n: cpu_block(lambda: None, n)], RULE, on_block=hook)
        summary = summarize_records(log)
        assert summary["remeasured_blocks"] == 0 and summary["unclean_blocks_kept"] == 0
        assert summary["power_slowdown_blocks"] == RULE.max_blocks  # seen and recorded
        sim.set_field(0, "clock_event_reasons_current", THERMAL | POWER_CAP)
        block = sampler.take()
    assert not block_is_clean(block, median_clock=None, power_is_steady=True)  # heat still counts


def test_nvml_index_for(sim: SimulatedNvml) -> None:
    uuid = recorded(sim, "uuid")
    assert nvml_index_for(sim, uuid, None) == 0
    assert nvml_index_for(sim, uuid.removeprefix("GPU-"), None) == 0
    assert nvml_index_for(sim, None, "0000:00:06.0") == 0
    assert nvml_index_for(sim, None, recorded(sim, "pci_bus_id")) == 0
    assert nvml_index_for(sim, "GPU-ffffffff", "0000:81:00.0") is None
    assert nvml_index_for(sim, None, "not a bus id") is None


def test_bad_arguments(sim: SimulatedNvml) -> None:
    with pytest.raises(ValueError, match="index 3"):
        TelemetrySampler(sim, 3)
    with pytest.raises(ValueError, match="period_s"):
        TelemetrySampler(sim, 0, period_s=0)


def test_empty_log() -> None:
    assert summarize_records([]) == {"blocks": 0, "remeasured_blocks": 0}


def test_logs_of_several_measurements_pool_by_label(sim: SimulatedNvml) -> None:
    sim.set_field(0, "clock_event_reasons_current", 0)
    log: list[BlockRecord] = []
    with TelemetrySampler(sim, 0, period_s=60) as sampler:
        for label in ("copy", "gemm"):
            hook = clean_block_hook(sampler, log, label=label)
            run_interleaved([lambda n: cpu_block(lambda: None, n)], RULE, on_block=hook)
    assert {r.label for r in log} == {"copy", "gemm"}
    summary = summarize_records(log)
    assert summary["blocks"] == 2 * RULE.max_blocks
    assert summary["remeasured_blocks"] == 0

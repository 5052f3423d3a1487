"""Telemetry samples from the simulated device: values, units, throttle decoding, missing getters."""

from __future__ import annotations

from host_tuning.nvml import SimulatedNvml, decode_clock_event_reasons, read_telemetry


def test_sample_carries_clocks_temperature_power_and_reasons() -> None:
    nvml = SimulatedNvml.from_fixture("h200-passthrough-vm")
    sample = read_telemetry(nvml, 0)
    assert sample.sm_clock_mhz == nvml.read(0, "clock_sm_current_mhz").value
    assert sample.mem_clock_mhz == nvml.read(0, "clock_memory_current_mhz").value
    assert sample.temperature_c == nvml.read(0, "temperature_c").value
    assert sample.power_w == nvml.read(0, "power_usage_mw").value / 1000
    assert sample.clock_event_reason_names == ["gpu_idle"]
    assert not sample.throttled
    assert sample.unavailable == {}
    assert sample.to_dict()["throttled"] is False


def test_thermal_and_power_reasons_mark_the_sample_throttled() -> None:
    nvml = SimulatedNvml.from_fixture("h200-passthrough-vm")
    nvml.set_field(0, "clock_event_reasons_current", 0x40 | 0x4)
    sample = read_telemetry(nvml, 0)
    assert sample.clock_event_reason_names == ["sw_power_cap", "hw_thermal_slowdown"]
    assert sample.throttled


def test_a_getter_that_fails_gives_none_and_why() -> None:
    nvml = SimulatedNvml.from_fixture("h200-passthrough-vm")
    nvml.set_field(0, "power_usage_mw", {"nvml_error": "GPU is lost"})
    sample = read_telemetry(nvml, 0)
    assert sample.power_w is None
    assert sample.unavailable == {"power_w": "NVML: GPU is lost"}
    assert sample.sm_clock_mhz is not None


def test_decode_names_unknown_bits() -> None:
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x1 | 0x800) == ["gpu_idle", "unknown_0x800"]

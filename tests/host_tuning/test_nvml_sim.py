"""The simulated NVML device: reads from fixtures, and a write path that enforces the part's limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host_tuning.nvml import (
    DEVICE_FIELDS,
    NvmlBackend,
    NvmlPermissionError,
    NvmlValueError,
    SimulatedNvml,
    fixture_names,
    read_all,
)
from host_tuning.nvml_sim import DATA_DIR

H200 = "h200-passthrough-vm"
RTX = "rtx4090-consumer"
REPO = Path(__file__).resolve().parents[2]
SHARED_GETTERS = REPO.parent / "shared" / "fixtures" / "h200-passthrough-vm.nvml-getters.txt"


def test_shipped_fixtures_load_and_answer_every_field() -> None:
    assert {H200, RTX} <= set(fixture_names())
    for name in fixture_names():
        nvml = SimulatedNvml.from_fixture(name)
        assert isinstance(nvml, NvmlBackend)
        readings = read_all(nvml, 0)
        assert set(readings) == set(DEVICE_FIELDS)
        for field, reading in readings.items():
            assert (reading.value is None) == (reading.reason is not None), field


def test_h200_fixture_matches_the_recording() -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    expected = {
        "name": "NVIDIA H200",
        "vbios_version": "96.00.A5.00.1A",
        "persistence_mode": 1,
        "virtualization_mode": 1,
        "pcie_link_gen_current": 5,
        "pcie_link_width_max": 16,
        "power_limit_constraints_mw": [200000, 700000],
        "ecc_mode": [1, 1],
        "mig_mode": [0, 0],
        "cuda_compute_capability": [9, 0],
        "clock_event_reasons_current": 1,
        "clock_event_reasons_supported": 511,
        "gpc_clk_vf_offset_range_mhz": [0, 0],
        "clock_sm_max_mhz": 1980,
        "supported_memory_clocks_mhz": [3201, 2201],
    }
    for field, value in expected.items():
        assert nvml.read(0, field).value == value, field
    assert nvml.read_system("driver_version").value == "580.159.04"
    assert nvml.read_system("cuda_driver_version").value == 13000
    graphics = nvml.read(0, "supported_graphics_clocks_mhz").value["3201"]
    assert len(graphics) == 110 and graphics[0] == 1980 and graphics[-1] == 345


@pytest.mark.skipif(not SHARED_GETTERS.exists(), reason="shared fixtures not mounted")
def test_h200_fixture_agrees_with_the_raw_getter_dump() -> None:
    raw = dict(
        line.split(": ", 1) for line in SHARED_GETTERS.read_text().splitlines() if ": " in line
    )
    nvml = SimulatedNvml.from_fixture(H200)
    assert (
        str(nvml.read(0, "power_limit_default_mw").value)
        == raw["nvmlDeviceGetPowerManagementDefaultLimit"]
    )
    assert str(nvml.read(0, "pcie_speed_mbps").value) == raw["nvmlDeviceGetPcieSpeed"]
    assert str(nvml.read(0, "num_gpu_cores").value) == raw["nvmlDeviceGetNumGpuCores"]


def test_unsupported_and_unrecorded_getters_give_a_reason(tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    fan = nvml.read(0, "fan_speed_pct")
    assert fan.value is None and fan.reason == "NVML: Not Supported"
    doc = json.loads((DATA_DIR / f"{H200}.json").read_text())
    del doc["devices"][0]["fields"]["temperature_c"]
    (tmp_path / "partial.json").write_text(json.dumps(doc))
    partial = SimulatedNvml.from_fixture(tmp_path / "partial.json")
    temperature = partial.read(0, "temperature_c")
    assert temperature.value is None and "not recorded in fixture" in temperature.reason


def test_bad_field_and_index_are_named() -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    with pytest.raises(ValueError, match="pcie_gen_now"):
        nvml.read(0, "pcie_gen_now")
    with pytest.raises(ValueError, match="index 3"):
        nvml.read(3, "name")
    with pytest.raises(ValueError, match="no_such_gpu"):
        SimulatedNvml.from_fixture("no_such_gpu")


def test_bad_fixture_files_name_the_offending_field(tmp_path: Path) -> None:
    good = json.loads((DATA_DIR / f"{H200}.json").read_text())
    bad_field = json.loads(json.dumps(good))
    bad_field["devices"][0]["fields"]["pcie_wdith_current"] = 16
    (tmp_path / "typo.json").write_text(json.dumps(bad_field))
    with pytest.raises(ValueError, match=r"devices\[0\]\.fields\.pcie_wdith_current"):
        SimulatedNvml.from_fixture(tmp_path / "typo.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        SimulatedNvml.from_fixture(tmp_path / "broken.json")
    (tmp_path / "schema.json").write_text(json.dumps({**good, "schema": "other/9"}))
    with pytest.raises(ValueError, match="'schema'"):
        SimulatedNvml.from_fixture(tmp_path / "schema.json")


def test_overrides_make_a_fixture_variant() -> None:
    nvml = SimulatedNvml.from_fixture(H200, overrides={"pcie_link_width_current": 8})
    assert nvml.read(0, "pcie_link_width_current").value == 8
    assert SimulatedNvml.from_fixture(H200).read(0, "pcie_link_width_current").value == 16
    with pytest.raises(ValueError, match="bogus"):
        SimulatedNvml.from_fixture(H200, overrides={"bogus": 1})


def test_every_write_needs_root() -> None:
    nvml = SimulatedNvml.from_fixture(RTX, root=False)
    writes = [
        lambda: nvml.set_persistence_mode(0, True),
        lambda: nvml.set_power_limit(0, 450000),
        lambda: nvml.set_gpu_locked_clocks(0, 2520, 2520),
        lambda: nvml.reset_gpu_locked_clocks(0),
        lambda: nvml.set_memory_locked_clocks(0, 10501, 10501),
        lambda: nvml.reset_memory_locked_clocks(0),
        lambda: nvml.set_applications_clocks(0, 10501, 2520),
        lambda: nvml.reset_applications_clocks(0),
        lambda: nvml.set_gpc_clk_vf_offset(0, 100),
        lambda: nvml.set_mem_clk_vf_offset(0, 100),
    ]
    for write in writes:
        with pytest.raises(NvmlPermissionError, match="Insufficient Permissions"):
            write()
    assert nvml.read(0, "persistence_mode").value == 0
    assert nvml.read(0, "gpc_clk_vf_offset_mhz").value == 0


def test_power_limit_within_constraints() -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    nvml.set_power_limit(0, 500000)
    assert nvml.read(0, "power_limit_mw").value == 500000
    assert nvml.read(0, "power_limit_enforced_mw").value == 500000
    with pytest.raises(NvmlValueError, match=r"power_limit_mw 750000 .*\[200000, 700000\]"):
        nvml.set_power_limit(0, 750000)
    with pytest.raises(NvmlValueError, match="integer"):
        nvml.set_power_limit(0, 500.5)
    assert nvml.read(0, "power_limit_mw").value == 500000


def test_clock_offsets_only_within_the_reported_range() -> None:
    h200 = SimulatedNvml.from_fixture(H200)
    with pytest.raises(NvmlValueError, match=r"gpc_clk_vf_offset_mhz 100 .*\[0, 0\]"):
        h200.set_gpc_clk_vf_offset(0, 100)
    rtx = SimulatedNvml.from_fixture(RTX)
    rtx.set_gpc_clk_vf_offset(0, 150)
    rtx.set_mem_clk_vf_offset(0, -500)
    assert rtx.read(0, "gpc_clk_vf_offset_mhz").value == 150
    assert rtx.read(0, "mem_clk_vf_offset_mhz").value == -500
    with pytest.raises(NvmlValueError, match=r"\[-200, 1000\]"):
        rtx.set_gpc_clk_vf_offset(0, 1001)
    assert rtx.read(0, "gpc_clk_vf_offset_mhz").value == 150


def test_locked_clocks_show_in_reasons_and_clocks_and_reset_restores() -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    nvml.set_gpu_locked_clocks(0, 1500, 1755)
    assert nvml.locked_clocks(0) == {"gpu": (1500, 1755)}
    assert nvml.read(0, "clock_event_reasons_current").value & 0x2
    assert 1500 <= nvml.read(0, "clock_sm_current_mhz").value <= 1755
    nvml.reset_gpu_locked_clocks(0)
    assert nvml.locked_clocks(0) == {}
    assert nvml.read(0, "clock_event_reasons_current").value == 1
    assert nvml.read(0, "clock_sm_current_mhz").value == 345
    with pytest.raises(NvmlValueError, match="above max_mhz"):
        nvml.set_gpu_locked_clocks(0, 1800, 1500)
    with pytest.raises(NvmlValueError, match=r"gpu_locked_clocks\.max_mhz 2100"):
        nvml.set_gpu_locked_clocks(0, 1500, 2100)
    with pytest.raises(NvmlValueError, match=r"memory_locked_clocks\.max_mhz 4000"):
        nvml.set_memory_locked_clocks(0, 3201, 4000)


def test_applications_clocks_must_be_a_supported_pair() -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    nvml.set_applications_clocks(0, 2201, 1500)
    assert nvml.read(0, "clock_graphics_applications_mhz").value == 1500
    with pytest.raises(NvmlValueError, match="memory_mhz 3000"):
        nvml.set_applications_clocks(0, 3000, 1500)
    with pytest.raises(NvmlValueError, match="graphics_mhz 1501"):
        nvml.set_applications_clocks(0, 3201, 1501)
    nvml.reset_applications_clocks(0)
    assert nvml.read(0, "clock_graphics_applications_mhz").value == 1980


def test_noop_writes_succeed_without_effect() -> None:
    nvml = SimulatedNvml.from_fixture(RTX, noop_writes=True)
    nvml.set_persistence_mode(0, True)
    nvml.set_gpc_clk_vf_offset(0, 200)
    nvml.set_gpu_locked_clocks(0, 2000, 2500)
    assert nvml.read(0, "persistence_mode").value == 0
    assert nvml.read(0, "gpc_clk_vf_offset_mhz").value == 0
    assert nvml.locked_clocks(0) == {}
    with pytest.raises(NvmlValueError):
        nvml.set_gpc_clk_vf_offset(0, 5000)

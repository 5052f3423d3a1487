"""Pre-flight findings and CPU pinning, on the simulated NVML device; read-only on a real GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from baselines.preflight import (
    CODES,
    PreflightRefused,
    gpu_local_cpus,
    parse_cpulist,
    pin_to_gpu_local_cpus,
    preflight,
)
from host_tuning.nvml import SimulatedNvml, probe_nvml
from host_tuning.profiles import load_profile

THERMAL = 0x20


@pytest.fixture
def sim() -> SimulatedNvml:
    return SimulatedNvml.from_fixture("h200-passthrough-vm")


@pytest.fixture
def affinity():
    """The affinity before the test, put back on every thread of this process afterwards."""
    before = os.sched_getaffinity(0)
    yield before
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), before)
        except (ProcessLookupError, PermissionError):
            continue


def codes(result) -> list[str]:
    return [f.code for f in result.findings]


def test_the_recorded_h200_is_fit(sim: SimulatedNvml, tmp_path: Path) -> None:
    result = preflight(0, nvml=sim, cpu_root=tmp_path)
    assert result.findings == []
    assert result.ok and not result.refused
    result.raise_if_refused()


def test_other_processes_but_not_this_one(sim: SimulatedNvml) -> None:
    sim.set_field(0, "compute_processes", [os.getpid()])
    assert preflight(0, nvml=sim).findings == []
    sim.set_field(0, "compute_processes", [os.getpid(), 4242, 17])
    (finding,) = preflight(0, nvml=sim).findings
    assert finding.code == "other_processes"
    assert finding.value == [17, 4242]
    assert "4242" in finding.message


def test_persistence_off(sim: SimulatedNvml) -> None:
    sim.set_field(0, "persistence_mode", 0)
    assert codes(preflight(0, nvml=sim)) == ["persistence_off"]


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("ecc_mode", [1, 0], "ecc_pending"),
        ("ecc_mode", [0, 1], "ecc_pending"),
        ("mig_mode", [0, 1], "mig_pending"),
    ],
)
def test_pending_mode_changes(sim: SimulatedNvml, field: str, value: list, code: str) -> None:
    sim.set_field(0, field, value)
    (finding,) = preflight(0, nvml=sim).findings
    assert finding.code == code
    assert finding.value == value
    assert "pending" in finding.message


def test_hot_gpu(sim: SimulatedNvml) -> None:
    # the fixture's lowest threshold is the GPU max operating temperature
    limit = sim.read(0, "temperature_gpu_max_c").value
    sim.set_field(0, "temperature_c", limit - 11)
    assert preflight(0, nvml=sim).findings == []
    sim.set_field(0, "temperature_c", limit - 10)
    assert codes(preflight(0, nvml=sim)) == ["gpu_hot"]
    assert preflight(0, nvml=sim, hot_margin_c=5).findings == []
    sim.set_field(0, "temperature_c", 40)
    sim.set_field(0, "clock_event_reasons_current", THERMAL)
    (finding,) = preflight(0, nvml=sim).findings
    assert finding.code == "gpu_hot"
    assert "sw_thermal_slowdown" in finding.message


def test_clock_lock_of_the_profile(sim: SimulatedNvml, tmp_path: Path) -> None:
    stable = load_profile("stable")
    missing = preflight(0, nvml=sim, profile=stable, cpu_root=tmp_path)
    assert codes(missing) == ["clock_lock_missing", "clock_lock_missing"]
    requested = {f.value["setting"]: f.value["requested"] for f in missing.findings}
    gpu_lock, memory_lock = requested["locked_clocks_mhz"], requested["memory_locked_clocks_mhz"]
    sim.set_memory_locked_clocks(0, *memory_lock)
    (left,) = preflight(0, nvml=sim, profile="stable", cpu_root=tmp_path).findings
    assert left.value["setting"] == "locked_clocks_mhz"
    assert left.value["current_mhz"] == sim.read(0, "clock_sm_current_mhz").value
    sim.set_gpu_locked_clocks(0, *gpu_lock)
    assert preflight(0, nvml=sim, profile="stable", cpu_root=tmp_path).findings == []
    # clocks in range but no lock reason: someone set them another way, or they drifted there
    sim.set_field(0, "clock_event_reasons_current", 0)
    assert codes(preflight(0, nvml=sim, profile=stable, cpu_root=tmp_path)) == [
        "clock_lock_missing",
        "clock_lock_missing",
    ]


def test_policy_and_overrides(sim: SimulatedNvml) -> None:
    sim.set_field(0, "persistence_mode", 0)
    sim.set_field(0, "mig_mode", [0, 1])
    warned = preflight(0, nvml=sim)
    assert {f.severity for f in warned.findings} == {"warn"}
    assert not warned.refused
    refused = preflight(0, nvml=sim, policy="refuse")
    assert refused.refused
    with pytest.raises(PreflightRefused, match=r"persistence_off.*mig_pending"):
        refused.raise_if_refused()
    mixed = preflight(0, nvml=sim, policy="refuse", per_finding={"persistence_off": "warn"})
    assert {f.code: f.severity for f in mixed.findings} == {
        "persistence_off": "warn",
        "mig_pending": "refuse",
    }
    quiet = preflight(0, nvml=sim, per_finding={"persistence_off": "ignore"})
    assert codes(quiet) == ["mig_pending"]
    doc = refused.to_dict()
    assert doc["refused"] is True
    assert [f["code"] for f in doc["findings"]] == ["persistence_off", "mig_pending"]
    assert refused.lines()[0].startswith("refuse: persistence_off:")


def test_unreadable_fields_warn_as_unchecked() -> None:
    sim = SimulatedNvml.from_fixture(
        "h200-passthrough-vm", overrides={"persistence_mode": {"nvml_error": "Not Supported"}}
    )
    result = preflight(0, nvml=sim, policy="refuse")
    (finding,) = result.findings
    assert (finding.code, finding.severity) == ("unchecked", "warn")
    assert "persistence_mode" in finding.message
    strict = preflight(0, nvml=sim, per_finding={"unchecked": "refuse"})
    assert strict.refused


@pytest.mark.skipif(probe_nvml().backend is not None, reason="NVML loads on this host")
def test_no_nvml_is_unchecked() -> None:
    (finding,) = preflight(0).findings
    assert finding.code == "unchecked"
    assert "NVML" in finding.message


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "maybe"}, "policy"),
        ({"per_finding": {"too_loud": "warn"}}, "too_loud"),
        ({"per_finding": {"gpu_hot": "shout"}}, r"per_finding\.gpu_hot"),
        ({"hot_margin_c": "ten"}, "hot_margin_c"),
        ({"profile": "no-such-profile"}, "no-such-profile"),
    ],
)
def test_bad_arguments_name_the_field(sim: SimulatedNvml, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        preflight(0, nvml=sim, **kwargs)


def test_bad_device_index(sim: SimulatedNvml) -> None:
    with pytest.raises(ValueError, match="device_index 3"):
        preflight(3, nvml=sim)


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]
    with pytest.raises(ValueError, match="'x-2'"):
        parse_cpulist("0,x-2")


def test_pin_to_the_cpus_nvml_names(sim: SimulatedNvml, affinity: set[int]) -> None:
    target = max(affinity)
    sim.set_field(0, "cpu_affinity", [target, 100_000])  # the second is not on this host
    assert pin_to_gpu_local_cpus(0, sim) == [target]
    assert os.sched_getaffinity(0) == {target}


def test_pin_falls_back_to_sysfs(sim: SimulatedNvml, affinity: set[int], tmp_path: Path) -> None:
    sim.set_field(0, "cpu_affinity", {"nvml_error": "Not Supported"})
    device = tmp_path / "sys/bus/pci/devices/0000:00:06.0"  # NVML says 00000000:00:06.0
    device.mkdir(parents=True)
    target = min(affinity)
    (device / "local_cpulist").write_text(f"{target}\n")
    assert gpu_local_cpus(0, sim, sysfs_root=tmp_path) == [target]
    assert pin_to_gpu_local_cpus(0, sim, sysfs_root=tmp_path) == [target]
    assert os.sched_getaffinity(0) == {target}


def test_no_known_local_cpu_leaves_affinity_alone(
    sim: SimulatedNvml, affinity: set[int], tmp_path: Path
) -> None:
    sim.set_field(0, "cpu_affinity", [100_000])
    assert pin_to_gpu_local_cpus(0, sim, sysfs_root=tmp_path) == []
    sim.set_field(0, "cpu_affinity", {"nvml_error": "Not Supported"})
    assert pin_to_gpu_local_cpus(0, sim, sysfs_root=tmp_path) == []  # no sysfs entry either
    assert os.sched_getaffinity(0) == affinity


@pytest.mark.gpu
def test_real_gpu_read_only(affinity: set[int]) -> None:
    result = preflight(0, profile="stable")
    assert set(codes(result)) <= set(CODES)
    print("\n".join(result.lines()) or "pre-flight: nothing found")
    local = gpu_local_cpus(0)
    pinned = pin_to_gpu_local_cpus(0)
    assert set(pinned) <= set(local)
    if pinned:
        assert os.sched_getaffinity(0) == set(pinned)

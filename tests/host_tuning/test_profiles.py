"""Profiles: the shipped files validate, user files name their bad fields, plans resolve on fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from host_tuning.nvml import SimulatedNvml, probe_nvml, read_all
from host_tuning.profiles import (
    PROFILES_DIR,
    SCHEMA_PATH,
    Change,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
    plan,
    profile_names,
    validate_profile,
)
from tests.host_tuning.fake_host import lay_out

H200 = "h200-passthrough-vm"
RTX = "rtx4090-consumer"
REPO = Path(__file__).resolve().parents[2]
REPORT_SCHEMA = REPO / "appliance" / "report" / "schemas" / "report-v1.schema.json"
CPU = "/sys/devices/system/cpu"


@pytest.fixture
def cpu_root(tmp_path: Path) -> Path:
    """Two CPUs on powersave, boost off, the kernel offering performance and powersave."""
    files = {f"{CPU}/cpufreq/boost": "0"}
    for cpu in (0, 1):
        files[f"{CPU}/cpu{cpu}/cpufreq/scaling_governor"] = "powersave"
        files[f"{CPU}/cpu{cpu}/cpufreq/scaling_available_governors"] = "performance powersave"
    return lay_out(tmp_path / "root", files, {})


def user_profile(tmp_path: Path, **changes: Any) -> Path:
    """The shipped stable profile with top-level sections replaced, written to a file."""
    doc = json.loads((PROFILES_DIR / "stable.json").read_text())
    doc.update(changes)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc))
    return path


def by_setting(changes: list[Change]) -> dict[str, Change]:
    return {c.setting: c for c in changes}


def test_shipped_profiles_validate_and_each_has_a_cpu_side() -> None:
    assert {"stable", "max", "overclock"} <= set(profile_names())
    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    for profile in list_profiles():
        doc = json.loads((PROFILES_DIR / f"{profile.name}.json").read_text())
        assert not list(Draft202012Validator(schema).iter_errors(doc)), profile.name
        assert profile.cpu["governor"] == "performance"
        assert profile.cpu["boost"] is not None
        assert profile.gpu["persistence_mode"] is True


@pytest.mark.parametrize("fixture", [H200, RTX])
@pytest.mark.parametrize("name", ["stable", "max", "overclock"])
def test_dry_run_reads_only_and_stays_within_what_the_part_allows(
    fixture: str, name: str, cpu_root: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(fixture)
    before = read_all(nvml, 0)
    changes = plan(load_profile(name), nvml, cpu_root=cpu_root)
    assert read_all(nvml, 0) == before
    assert nvml.locked_clocks(0) == {}
    assert (cpu_root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text() == (
        "powersave\n"
    )
    assert changes and all(c.status in ("planned", "skipped") for c in changes)
    graphics = [c for cs in before["supported_graphics_clocks_mhz"].value.values() for c in cs]
    lo_w, hi_w = (v / 1000 for v in before["power_limit_constraints_mw"].value)
    for change in changes:
        if change.status != "planned":
            assert change.note, change
            continue
        if change.setting.endswith("power_limit_w"):
            assert lo_w <= change.after <= hi_w
        if change.setting.endswith(".locked_clocks_mhz"):
            assert all(c in graphics for c in change.after)
        if change.setting.endswith("memory_locked_clocks_mhz"):
            assert set(change.after) <= set(before["supported_memory_clocks_mhz"].value)
        if change.setting.endswith("_offset_mhz"):
            field = change.setting.split(".")[1].replace("_mhz", "_range_mhz")
            lo, hi = before[field].value
            assert lo <= change.after <= hi and (lo, hi) != (0, 0)


def test_stable_on_the_h200_locks_the_sustained_clock_and_memory_at_max(cpu_root: Path) -> None:
    changes = by_setting(
        plan(load_profile("stable"), SimulatedNvml.from_fixture(H200), cpu_root=cpu_root)
    )
    assert changes["gpu0.locked_clocks_mhz"].after == [1755, 1755]
    assert changes["gpu0.locked_clocks_mhz"].status == "planned"
    assert changes["gpu0.memory_locked_clocks_mhz"].after == [3201, 3201]
    assert changes["gpu0.persistence_mode"].status == "skipped"  # already on
    assert changes["gpu0.power_limit_w"].status == "skipped"  # already at the 700 W default
    assert changes["cpu.governor"].before == "powersave"
    assert changes["cpu.governor"].after == "performance"
    assert changes["cpu.boost"].before is False and changes["cpu.boost"].after is True


def test_max_sustained_without_a_recorded_clock_falls_back_and_says_so(cpu_root: Path) -> None:
    changes = by_setting(
        plan(load_profile("stable"), SimulatedNvml.from_fixture(RTX), cpu_root=cpu_root)
    )
    lock = changes["gpu0.locked_clocks_mhz"]
    assert lock.after == [2520, 2520]  # the consumer fixture's default applications clock
    assert "no sustained clock recorded for RTX 4090/5090" in lock.note
    assert changes["gpu0.persistence_mode"].status == "planned"


def test_overclock_changes_nothing_on_a_part_without_offsets(cpu_root: Path) -> None:
    changes = by_setting(
        plan(load_profile("overclock"), SimulatedNvml.from_fixture(H200), cpu_root=cpu_root)
    )
    for name in ("gpc_clk_vf_offset_mhz", "mem_clk_vf_offset_mhz"):
        change = changes[f"gpu0.{name}"]
        assert change.status == "skipped"
        assert "not supported by this part" in change.note and "[0, 0]" in change.note
        assert change.before == 0
    assert not [
        c for c in changes.values() if c.setting.startswith("gpu") and c.status == "planned"
    ]
    rtx = by_setting(
        plan(load_profile("overclock"), SimulatedNvml.from_fixture(RTX), cpu_root=cpu_root)
    )
    assert rtx["gpu0.gpc_clk_vf_offset_mhz"].status == "planned"
    assert rtx["gpu0.power_limit_w"].after == 600


def test_without_cpufreq_the_cpu_side_is_skipped_with_the_reason(tmp_path: Path) -> None:
    changes = by_setting(plan(load_profile("stable"), None, cpu_root=tmp_path))
    assert set(changes) == {"cpu.governor", "cpu.boost"}
    assert changes["cpu.governor"].status == "skipped"
    assert "cpufreq not exposed" in changes["cpu.governor"].note


def test_every_gpu_when_index_is_none(cpu_root: Path) -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    assert by_setting(plan(load_profile("max"), nvml, None, cpu_root=cpu_root)).keys() == (
        by_setting(plan(load_profile("max"), nvml, 0, cpu_root=cpu_root)).keys()
    )


@pytest.mark.parametrize(
    ("section", "value", "expected"),
    [
        ("gpu", {"locked_clocks_mhz": [1755, "fast"]}, r"profile\.gpu\.locked_clocks_mhz\[1\]: \"fast\" is not valid"),
        ("gpu", {"lock_clocks": [1, 2]}, r"profile\.gpu\.lock_clocks: unknown field"),
        ("gpu", {"power_limit_w": -5}, r"profile\.gpu\.power_limit_w: -5 is not valid; expected watts"),
        ("gpu", {"locked_clocks_mhz": [1900, 1500]}, r"profile\.gpu\.locked_clocks_mhz: min 1900 MHz is above max 1500"),
        ("gpu", {"persistence_mode": "yes"}, r"profile\.gpu\.persistence_mode: \"yes\""),
        ("cpu", {"governor": "turbo"}, r"profile\.cpu\.governor: \"turbo\" is not valid"),
        ("families", {"H300": {}}, r"profile\.families: \"H300\" is not valid; expected a GPU family"),
        ("families", {"RTX 4090/5090": {"gpc_clk_vf_offset_mhz": 1.5}}, r"profile\.families\[\"RTX 4090/5090\"\]\.gpc_clk_vf_offset_mhz"),
        ("name", "Bad Name", r"profile\.name: \"Bad Name\" is not valid"),
    ],
)  # fmt: skip
def test_bad_user_profiles_name_the_field(
    tmp_path: Path, section: str, value: Any, expected: str
) -> None:
    path = user_profile(tmp_path, **{section: value})
    with pytest.raises(ProfileError, match=expected) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_missing_sections_and_unreadable_files_are_named(tmp_path: Path) -> None:
    doc = json.loads((PROFILES_DIR / "max.json").read_text())
    del doc["cpu"]
    with pytest.raises(ProfileError, match=r"profile\.cpu: missing \(required\)"):
        validate_profile(doc, "inline")
    del doc["gpu"]
    with pytest.raises(ProfileError) as err:
        validate_profile(doc, "inline")
    said = str(err.value)  # each missing field named once
    assert said.count("profile.cpu: missing") == 1 and said.count("profile.gpu: missing") == 1
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ProfileError, match="is not JSON"):
        load_profile(tmp_path / "broken.json")
    with pytest.raises(ProfileError, match=r"unknown profile 'fastest'.*overclock"):
        load_profile("fastest")


@pytest.mark.parametrize(
    ("gpu", "fixture", "expected"),
    [
        ({"locked_clocks_mhz": [1500, 2500]}, H200, r"profile\.gpu\.locked_clocks_mhz\[1\]: 2500 MHz is above the maximum .* \(1980 MHz\)"),
        ({"locked_clocks_mhz": [100, 1500]}, H200, r"profile\.gpu\.locked_clocks_mhz\[0\]: 100 MHz is below the minimum .* \(345 MHz\)"),
        ({"power_limit_w": 800}, H200, r"profile\.gpu\.power_limit_w: 800 W is above the maximum .* \(700 W\)"),
        ({"memory_locked_clocks_mhz": [3201, 4000]}, H200, r"memory_locked_clocks_mhz\[1\]: 4000 MHz is above"),
        ({"gpc_clk_vf_offset_mhz": 1500}, RTX, r"profile\.gpu\.gpc_clk_vf_offset_mhz: 1500 MHz is above the maximum .* \(1000 MHz\)"),
        ({"locked_clocks_mhz": [3000, "default"]}, RTX, r"locked_clocks_mhz: min resolves to 3000 MHz, above max 2520"),
    ],
)  # fmt: skip
def test_values_outside_what_the_part_reports_are_refused_by_field(
    tmp_path: Path, cpu_root: Path, gpu: dict[str, Any], fixture: str, expected: str
) -> None:
    profile = load_profile(user_profile(tmp_path, gpu=gpu))
    with pytest.raises(ProfileError, match=expected):
        plan(profile, SimulatedNvml.from_fixture(fixture), cpu_root=cpu_root)


def test_a_governor_the_kernel_does_not_offer_is_refused(tmp_path: Path, cpu_root: Path) -> None:
    profile = load_profile(user_profile(tmp_path, cpu={"governor": "schedutil"}))
    with pytest.raises(ProfileError, match=r"profile\.cpu\.governor: 'schedutil' is not offered"):
        plan(profile, None, cpu_root=cpu_root)


def test_family_sections_override_the_gpu_section(tmp_path: Path, cpu_root: Path) -> None:
    path = user_profile(tmp_path, families={"H100/H200": {"locked_clocks_mhz": [1500, 1500]}})
    profile = load_profile(path)
    h200 = by_setting(plan(profile, SimulatedNvml.from_fixture(H200), cpu_root=cpu_root))
    rtx = by_setting(plan(profile, SimulatedNvml.from_fixture(RTX), cpu_root=cpu_root))
    assert h200["gpu0.locked_clocks_mhz"].after == [1500, 1500]
    assert rtx["gpu0.locked_clocks_mhz"].after == [2520, 2520]
    _, source = profile.gpu_setting("H100/H200", "locked_clocks_mhz")
    assert source == 'profile.families["H100/H200"].locked_clocks_mhz'
    bad = load_profile(user_profile(tmp_path, families={"H100/H200": {"power_limit_w": 900}}))
    with pytest.raises(
        ProfileError, match=r"profile\.families\[\"H100/H200\"\]\.power_limit_w: 900"
    ):
        plan(bad, SimulatedNvml.from_fixture(H200), cpu_root=cpu_root)


@pytest.mark.skipif(not REPORT_SCHEMA.exists(), reason="report schema not in this checkout")
def test_changes_fit_the_report_schema(cpu_root: Path) -> None:
    schema = json.loads(REPORT_SCHEMA.read_text())
    change_schema = {**schema["$defs"]["profile_change"], "$defs": schema["$defs"]}
    validator = Draft202012Validator(change_schema)
    for profile in list_profiles():
        for change in plan(profile, SimulatedNvml.from_fixture(RTX), cpu_root=cpu_root):
            errors = list(validator.iter_errors(change.to_dict()))
            assert not errors, (change, errors[0].message)


def test_profile_is_plain_data() -> None:
    profile = load_profile("stable")
    assert isinstance(profile, Profile)
    assert profile.sustained_clocks_mhz["H100/H200"] == 1755
    assert profile.gpu_setting("A100", "power_limit_w") == ("default", "profile.gpu.power_limit_w")


@pytest.mark.gpu
def test_dry_run_on_the_real_gpu_resolves_and_changes_nothing(tmp_path: Path) -> None:
    probe = probe_nvml()  # read-only: its setters refuse, whatever a plan does
    assert probe.backend is not None, probe.reason
    watched = ("power_limit_mw", "persistence_mode")
    with probe.backend as nvml:
        assert not nvml.writable
        before = {f: nvml.read(0, f).value for f in watched}
        supported = nvml.read(0, "supported_graphics_clocks_mhz").value
        graphics = {c for clocks in supported.values() for c in clocks}
        lo_mw, hi_mw = nvml.read(0, "power_limit_constraints_mw").value
        for profile in list_profiles():
            for change in plan(profile, nvml, cpu_root=tmp_path):
                assert change.status in ("planned", "skipped"), change
                if change.status == "planned" and change.setting.endswith(".locked_clocks_mhz"):
                    assert set(change.after) <= graphics
                if change.status == "planned" and change.setting.endswith("power_limit_w"):
                    assert lo_mw <= change.after * 1000 <= hi_mw
        after = {f: nvml.read(0, f).value for f in watched}
    assert after["power_limit_mw"] == before["power_limit_mw"]
    assert after["persistence_mode"] == before["persistence_mode"]

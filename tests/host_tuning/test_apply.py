"""Apply and restore on the simulated devices: read-back, refusals, undo on failure and signals,
and a real process killed with SIGKILL in the middle of an apply, then restored."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from jsonschema import Draft202012Validator

from host_tuning.apply import (
    USER_ERRORS,
    ApplyFailed,
    ApplyInterrupted,
    ApplyRefused,
    PersistentSimulatedNvml,
    apply_profile,
    format_value,
    profile_applied,
    render_plan_table,
    render_profiles_table,
    report_section,
    restore_journal,
)
from host_tuning.journal import JournalError, JournalOpenError, read_journal
from host_tuning.nvml import NvmlBackend, RealNvml, SimulatedNvml, read_all
from host_tuning.profiles import ProfileError, list_profiles, load_profile, plan
from tests.host_tuning.fake_host import lay_out

H200 = "h200-passthrough-vm"
RTX = "rtx4090-consumer"
REPO = Path(__file__).resolve().parents[2]
REPORT_SCHEMA = REPO / "appliance" / "report" / "schemas" / "report-v1.schema.json"
CPU = "/sys/devices/system/cpu"
GOVERNORS = [f"{CPU}/cpu{n}/cpufreq/scaling_governor" for n in (0, 1)]
BOOST = f"{CPU}/cpufreq/boost"
CHILD_TIMEOUT_S = 60  # a safety net against a hung child, not a measurement


@pytest.fixture
def cpu_root(tmp_path: Path) -> Path:
    files = {BOOST: "0", f"{CPU}/cpu0/cpufreq/scaling_available_governors": "performance powersave"}
    files.update({path: "powersave" for path in GOVERNORS})
    return lay_out(tmp_path / "root", files, {})


def cpu_state(root: Path) -> dict[str, str]:
    return {p: (root / p.lstrip("/")).read_text().strip() for p in [*GOVERNORS, BOOST]}


def device_state(nvml: NvmlBackend) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every NVML field, and the locks NVML itself cannot read."""
    return read_all(nvml, 0), nvml.locked_clocks(0)


def original(fixture: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return device_state(SimulatedNvml.from_fixture(fixture))


def events(journal: Path) -> list[tuple[str, int | None]]:
    return [(r["event"], r.get("seq")) for r in map(json.loads, journal.read_text().splitlines())]


# --- in-process ------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [H200, RTX])
@pytest.mark.parametrize("name", ["stable", "max", "overclock"])
def test_apply_reads_back_every_value_and_restore_puts_every_value_back(
    fixture: str, name: str, cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(fixture)
    journal = tmp_path / "journal.jsonl"
    result = apply_profile(load_profile(name), nvml, journal, cpu_root=cpu_root)
    assert result.applied, "every shipped profile changes something on these fixtures"
    fields, locks = device_state(nvml)
    for change in result.applied:
        setting = change.setting.split(".", 1)[1]
        if setting == "power_limit_w":
            assert fields["power_limit_mw"].value == change.after * 1000
        elif setting == "persistence_mode":
            assert fields["persistence_mode"].value == int(change.after)
        elif setting.endswith("_offset_mhz"):
            assert fields[setting].value == change.after
        elif setting == "locked_clocks_mhz":
            assert locks["gpu"] == tuple(change.after)
        elif setting == "memory_locked_clocks_mhz":
            assert locks["memory"] == tuple(change.after)
    assert cpu_state(cpu_root) == {**dict.fromkeys(GOVERNORS, "performance"), BOOST: "1"}
    assert not read_journal(journal).closed

    restored = restore_journal(journal, nvml)
    assert [c.setting for c in restored.changes] == [c.setting for c in reversed(result.applied)]
    assert device_state(nvml) == original(fixture)
    assert cpu_state(cpu_root) == {**dict.fromkeys(GOVERNORS, "powersave"), BOOST: "0"}
    assert read_journal(journal).closed
    assert restore_journal(journal, nvml).changes == []  # closed: nothing left to do


def test_the_journal_holds_each_old_value_before_its_change(cpu_root: Path, tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_fixture(RTX)
    journal = tmp_path / "journal.jsonl"
    seen: list[tuple[str, Any]] = []

    def on_record(record: dict[str, Any]) -> None:
        if record["event"] == "change" and record["setting"] == "gpu0.power_limit_w":
            on_disk = read_journal(journal).entries[-1]
            seen.append((on_disk.setting, on_disk.snapshot))
            seen.append(("device", nvml.read(0, "power_limit_mw").value))

    apply_profile(load_profile("max"), nvml, journal, cpu_root=cpu_root, on_record=on_record)
    assert seen == [("gpu0.power_limit_w", 450000), ("device", 450000)]
    assert nvml.read(0, "power_limit_mw").value == 600000


def test_without_root_nothing_changes_and_the_journal_closes(
    cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(RTX, root=False)
    journal = tmp_path / "journal.jsonl"
    with pytest.raises(ApplyFailed, match=r"Insufficient Permissions.*nothing is left changed"):
        apply_profile(load_profile("overclock"), nvml, journal, cpu_root=cpu_root)
    assert device_state(nvml) == original(RTX)
    assert cpu_state(cpu_root)[GOVERNORS[0]] == "powersave"
    assert read_journal(journal).closed and ("failed", 1) in events(journal)


def test_out_of_range_is_refused_before_anything_is_written(cpu_root: Path, tmp_path: Path) -> None:
    profile_path = tmp_path / "hot.json"
    doc = json.loads(Path(load_profile("max").source).read_text())
    doc["gpu"]["power_limit_w"] = 900
    profile_path.write_text(json.dumps(doc))
    nvml = SimulatedNvml.from_fixture(H200)
    journal = tmp_path / "journal.jsonl"
    with pytest.raises(ProfileError, match=r"profile\.gpu\.power_limit_w: 900 W is above"):
        apply_profile(load_profile(profile_path), nvml, journal, cpu_root=cpu_root)
    assert not journal.exists()
    assert device_state(nvml) == original(H200)
    assert cpu_state(cpu_root)[GOVERNORS[0]] == "powersave"


def test_an_unwritable_journal_or_a_missing_gpu_changes_nothing(
    cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(RTX)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(JournalError, match=r"journal .*a-file/j\.jsonl: Not a directory"):
        apply_profile(load_profile("max"), nvml, tmp_path / "a-file" / "j.jsonl", cpu_root=cpu_root)
    with pytest.raises(ProfileError, match="no GPU 1: NVML sees GPUs 0 to 0"):
        apply_profile(load_profile("max"), nvml, tmp_path / "j.jsonl", index=1, cpu_root=cpu_root)
    assert device_state(nvml) == original(RTX)
    assert cpu_state(cpu_root)[GOVERNORS[0]] == "powersave"


def test_other_processes_on_the_gpu_block_the_apply(cpu_root: Path, tmp_path: Path) -> None:
    busy = SimulatedNvml.from_fixture(RTX, overrides={"compute_processes": [4242, os.getpid()]})
    with pytest.raises(ApplyRefused, match=r"gpu0 is in use by pid\(s\) 4242:"):
        apply_profile(load_profile("max"), busy, tmp_path / "j.jsonl", cpu_root=cpu_root)
    assert not (tmp_path / "j.jsonl").exists()
    assert read_all(busy, 0)["power_limit_mw"].value == 450000
    mine = SimulatedNvml.from_fixture(RTX, overrides={"compute_processes": [os.getpid()]})
    assert apply_profile(load_profile("max"), mine, tmp_path / "k.jsonl", cpu_root=cpu_root).applied


def test_a_setter_without_effect_is_detected_and_nothing_stays_changed(
    cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(RTX, noop_writes=True)
    journal = tmp_path / "journal.jsonl"
    with pytest.raises(ApplyFailed, match=r"gpu0\.persistence_mode: the setter reported success"):
        apply_profile(load_profile("stable"), nvml, journal, cpu_root=cpu_root)
    assert device_state(nvml) == original(RTX)
    assert read_journal(journal).closed


def test_a_noop_in_the_middle_undoes_the_changes_before_it(cpu_root: Path, tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_fixture(RTX)
    journal = tmp_path / "journal.jsonl"

    def third_setter_has_no_effect(record: dict[str, Any]) -> None:
        if record.get("seq") == 3:
            nvml.noop_writes = record["event"] == "change"

    with pytest.raises(ApplyFailed, match=r"gpc_clk_vf_offset_mhz.*undid 3 change\(s\)"):
        apply_profile(
            load_profile("overclock"),
            nvml,
            journal,
            cpu_root=cpu_root,
            on_record=third_setter_has_no_effect,
        )
    assert ("applied", 1) in events(journal) and ("applied", 2) in events(journal)
    assert events(journal)[-4:] == [("undone", 3), ("undone", 2), ("undone", 1), ("close", None)]
    assert device_state(nvml) == original(RTX)


def test_an_open_journal_blocks_a_second_apply_until_restored(
    cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(RTX)
    journal = tmp_path / "journal.jsonl"
    apply_profile(load_profile("max"), nvml, journal, cpu_root=cpu_root)
    changed = device_state(nvml)
    with pytest.raises(JournalOpenError, match="autotune host restore"):
        apply_profile(load_profile("stable"), nvml, journal, cpu_root=cpu_root)
    assert device_state(nvml) == changed
    restore_journal(journal, nvml)
    assert apply_profile(load_profile("stable"), nvml, journal, cpu_root=cpu_root).applied


def test_a_held_profile_is_undone_when_the_block_ends_or_fails(
    cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(H200)
    journal = tmp_path / "journal.jsonl"
    with profile_applied(load_profile("stable"), nvml, journal, cpu_root=cpu_root) as result:
        assert nvml.locked_clocks(0) == {"gpu": (1755, 1755), "memory": (3201, 3201)}
        assert len(result.applied) == 4
    assert device_state(nvml) == original(H200) and read_journal(journal).closed
    with (
        pytest.raises(ZeroDivisionError),
        profile_applied(load_profile("max"), nvml, journal, cpu_root=cpu_root),
    ):
        assert nvml.locked_clocks(0)
        _ = 1 / 0
    assert device_state(nvml) == original(H200) and read_journal(journal).closed


def test_sigterm_to_this_process_while_held_restores(cpu_root: Path, tmp_path: Path) -> None:
    nvml = SimulatedNvml.from_fixture(RTX)
    journal = tmp_path / "journal.jsonl"
    handler = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(ApplyInterrupted, match="SIGTERM") as err,
        profile_applied(load_profile("overclock"), nvml, journal, cpu_root=cpu_root),
    ):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal interrupts this
    assert err.value.exit_code == 143
    assert device_state(nvml) == original(RTX) and read_journal(journal).closed
    assert signal.getsignal(signal.SIGTERM) == handler


def test_sigint_in_the_middle_of_an_apply_undoes_what_was_done(
    cpu_root: Path, tmp_path: Path
) -> None:
    nvml = SimulatedNvml.from_fixture(RTX)
    journal = tmp_path / "journal.jsonl"

    def interrupt_at_third(record: dict[str, Any]) -> None:
        if record["event"] == "change" and record["seq"] == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(ApplyInterrupted, match=r"SIGINT; undid 3 change\(s\)"):
        apply_profile(
            load_profile("max"), nvml, journal, cpu_root=cpu_root, on_record=interrupt_at_third
        )
    assert device_state(nvml) == original(RTX)
    assert cpu_state(cpu_root)[GOVERNORS[1]] == "powersave"
    assert read_journal(journal).closed


def test_a_simulated_journal_is_never_replayed_on_a_real_device(
    cpu_root: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    apply_profile(load_profile("max"), SimulatedNvml.from_fixture(RTX), journal, cpu_root=cpu_root)
    with pytest.raises(JournalError, match="written for a simulated NVML device"):
        restore_journal(journal, RealNvml(pynvml))  # never initialised: it could not write anyway
    assert not read_journal(journal).closed


def test_cli_helpers_show_the_plan(cpu_root: Path) -> None:
    changes = plan(load_profile("overclock"), SimulatedNvml.from_fixture(RTX), cpu_root=cpu_root)
    table = render_plan_table(changes)
    assert table.row_count == len(changes)
    assert [c.header for c in table.columns] == ["setting", "before", "after", "status", "note"]
    assert render_plan_table([c.to_dict() for c in changes]).row_count == len(changes)
    assert format_value("gpu0.power_limit_w", 600) == "600 W"
    assert format_value("gpu0.gpc_clk_vf_offset_mhz", 100) == "+100 MHz"
    assert format_value("gpu0.locked_clocks_mhz", [1755, 1755]) == "1755 MHz"
    assert format_value("gpu0.locked_clocks_mhz", [1500, 1755]) == "1500-1755 MHz"
    assert format_value("cpu.boost", True) == "on"
    assert format_value("gpu0.locked_clocks_mhz", None) == "?"
    assert ApplyInterrupted in USER_ERRORS and ProfileError in USER_ERRORS
    assert render_profiles_table(list_profiles()).row_count == len(list_profiles())


@pytest.mark.skipif(not REPORT_SCHEMA.exists(), reason="report schema not in this checkout")
def test_report_sections_fit_the_report_schema(cpu_root: Path, tmp_path: Path) -> None:
    schema = json.loads(REPORT_SCHEMA.read_text())
    validator = Draft202012Validator({**schema["$defs"]["profile"], "$defs": schema["$defs"]})
    nvml = SimulatedNvml.from_fixture(RTX)
    dry = report_section("max", plan(load_profile("max"), nvml, cpu_root=cpu_root), applied=False)
    result = apply_profile(load_profile("max"), nvml, tmp_path / "j.jsonl", cpu_root=cpu_root)
    done = report_section("max", result.changes, applied=True, restored=True)
    undone = restore_journal(tmp_path / "j.jsonl", nvml).changes
    back = report_section("max", undone, applied=True, restored=True)
    for section in (dry, done, back):
        assert not list(validator.iter_errors(section)), section
    assert dry["mode"] == "dry-run" and dry["restored"] is None
    assert {c["status"] for c in done["changes"]} == {"applied"}


# --- across processes: the simulated device persists in a state file --------------


def child(tmp_path: Path, cpu_root: Path, *args: str, fixture: str = RTX) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "host_tuning.apply",
        "--simulate", fixture,
        "--state", str(tmp_path / "device.state"),
        "--journal", str(tmp_path / "journal.jsonl"),
        "--cpu-root", str(cpu_root),
        *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_line(proc: subprocess.Popen, prefix: str) -> list[str]:
    """Lines the child printed up to and including one that starts with `prefix`."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=CHILD_TIMEOUT_S)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"no {prefix!r} from the child within {CHILD_TIMEOUT_S} s: {seen}")
        seen.append(line.strip())
        if line.startswith(prefix):
            return seen


def device_in(tmp_path: Path, fixture: str = RTX) -> PersistentSimulatedNvml:
    return PersistentSimulatedNvml(fixture, tmp_path / "device.state")


@pytest.mark.parametrize("k", [1, 3, 5])
def test_kill_9_in_the_middle_of_an_apply_then_restore(
    k: int, cpu_root: Path, tmp_path: Path
) -> None:
    # stable on the consumer card: persistence, memory lock, graphics lock, governor, boost
    proc = child(tmp_path, cpu_root, "--profile", "stable", "--pause-at", str(k))
    wait_for_line(proc, f"paused {k}")
    journal = tmp_path / "journal.jsonl"
    assert [e for e in events(journal) if e[0] == "change"] == [
        ("change", s) for s in range(1, k + 1)
    ]
    if k > 1:
        assert device_state(device_in(tmp_path)) != original(RTX)  # the first change took
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not read_journal(journal).closed

    result = restore_journal(journal, device_in(tmp_path))
    assert [c.setting for c in result.changes][-1] == "gpu0.persistence_mode"
    assert len(result.changes) == k
    assert device_state(device_in(tmp_path)) == original(RTX)
    assert cpu_state(cpu_root) == {**dict.fromkeys(GOVERNORS, "powersave"), BOOST: "0"}
    assert read_journal(journal).closed


def test_kill_9_while_held_then_restore_from_another_process(
    cpu_root: Path, tmp_path: Path
) -> None:
    proc = child(tmp_path, cpu_root, "--profile", "overclock", "--hold")
    wait_for_line(proc, "holding")
    changed = device_in(tmp_path)
    assert changed.read(0, "gpc_clk_vf_offset_mhz").value == 100
    assert changed.read(0, "power_limit_mw").value == 600000
    with pytest.raises(JournalError, match="still runs"):
        restore_journal(tmp_path / "journal.jsonl", changed)
    proc.kill()
    proc.wait()
    restorer = child(tmp_path, cpu_root, "--restore")
    out, err = restorer.communicate(timeout=CHILD_TIMEOUT_S)
    assert restorer.returncode == 0, err
    assert "restored 6 change(s)" in out
    assert device_state(device_in(tmp_path)) == original(RTX)
    assert cpu_state(cpu_root)[GOVERNORS[0]] == "powersave"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("when", ["--pause-at=3", "--hold"])
def test_sigterm_and_sigint_make_the_child_restore_on_its_own(
    sig: signal.Signals, when: str, cpu_root: Path, tmp_path: Path
) -> None:
    proc = child(tmp_path, cpu_root, "--profile", "max", when)
    wait_for_line(proc, "paused 3" if "pause" in when else "holding")
    assert device_state(device_in(tmp_path)) != original(RTX)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 128 + sig, err
    assert signal.Signals(sig).name in err
    assert device_state(device_in(tmp_path)) == original(RTX)
    assert cpu_state(cpu_root) == {**dict.fromkeys(GOVERNORS, "powersave"), BOOST: "0"}
    assert read_journal(tmp_path / "journal.jsonl").closed


def test_a_second_process_sees_the_first_ones_changes(cpu_root: Path, tmp_path: Path) -> None:
    proc = child(tmp_path, cpu_root, "--profile", "stable", fixture=H200)
    out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0, err
    assert "applied 4 change(s)" in out
    device = device_in(tmp_path, H200)
    assert device.locked_clocks(0) == {"gpu": (1755, 1755), "memory": (3201, 3201)}
    again = child(tmp_path, cpu_root, "--profile", "max", fixture=H200)
    _, err = again.communicate(timeout=CHILD_TIMEOUT_S)
    assert again.returncode == 1 and "autotune host restore" in err
    restore_journal(tmp_path / "journal.jsonl", device)
    assert device_state(device_in(tmp_path, H200)) == original(H200)

"""`autotune host profiles|apply|restore` from the command line (dry runs only: the write path is
tested against the simulated NVML device in tests/host_tuning)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def autotune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance", *args], capture_output=True, text=True, timeout=120
    )


def test_profiles_lists_the_shipped_ones() -> None:
    result = autotune("host", "profiles", "--json")
    assert result.returncode == 0, result.stderr
    assert {"stable", "max", "overclock"} <= {p["name"] for p in json.loads(result.stdout)}


def test_apply_without_flag_is_a_dry_run_that_plans() -> None:
    result = autotune("host", "apply", "stable", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["applied"] is False and data["journal"] is None
    assert all({"setting", "before", "after", "status"} <= set(c) for c in data["changes"])


def test_malformed_profile_is_rejected_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"name": "bad", "description": "x", "gpu": {"power_limit_w": "lots"}})
    )
    result = autotune("host", "apply", str(bad))
    assert result.returncode == 2
    assert "power_limit_w" in result.stderr and "Traceback" not in result.stderr


def test_restore_without_a_journal_has_nothing_to_do(tmp_path: Path) -> None:
    result = autotune("host", "restore", "--journal", str(tmp_path / "journal.jsonl"), "--json")
    assert result.returncode == 0, result.stderr
    assert "nothing to restore" in json.loads(result.stdout)["note"]


def test_apply_then_restore_on_a_simulated_h200_from_the_command_line(tmp_path: Path) -> None:
    from host_tuning.apply import PersistentSimulatedNvml

    sim, journal = tmp_path / "sim", tmp_path / "journal.json"
    common = ["--simulate", "h200", "--sim-dir", str(sim), "--journal", str(journal), "--json"]
    applied = autotune("host", "apply", "stable", "--apply", *common)
    assert applied.returncode == 0, applied.stderr
    data = json.loads(applied.stdout)
    assert data["applied"] is True and data["journal"] == str(journal)
    device = PersistentSimulatedNvml("h200-passthrough-vm", sim / "nvml-state.jsonl")
    locked = device.locked_clocks(0)
    assert locked, "the stable profile locks clocks"

    again = autotune("host", "apply", "stable", "--apply", *common)
    assert again.returncode == 1 and "restore" in again.stderr

    restored = autotune("host", "restore", *common[:-1], "--json")
    assert restored.returncode == 0, restored.stderr
    device = PersistentSimulatedNvml("h200-passthrough-vm", sim / "nvml-state.jsonl")
    assert not any(device.locked_clocks(0).values())

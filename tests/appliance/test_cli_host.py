"""`autotune host profiles|apply|restore` from the command line (dry runs only: the write path is
tested against the simulated NVML device in tests/host_tuning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def autotune(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "appliance", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
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
    """At the default path (here $AUTOTUNE_HOST_JOURNAL) a missing journal is nothing to undo; a
    journal named with --journal that is not there is bad input (a typo must not pass for a
    restore)."""
    env = {**os.environ, "AUTOTUNE_HOST_JOURNAL": str(tmp_path / "journal.jsonl")}
    result = autotune("host", "restore", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert "nothing to restore" in json.loads(result.stdout)["note"]
    named = autotune("host", "restore", "--journal", str(tmp_path / "typo.jsonl"))
    assert named.returncode == 2 and "no such file" in named.stderr


def test_a_journal_path_that_cannot_be_used_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    journal = tmp_path / "file" / "journal.jsonl"  # a folder that is a file
    sim = ["--simulate", "h200", "--sim-dir", str(tmp_path / "sim")]
    result = autotune("host", "apply", "stable", "--apply", *sim, "--journal", str(journal))
    assert result.returncode == 2, result.stderr
    assert "journal" in result.stderr and "Not a directory" in result.stderr


def test_an_open_journal_names_the_restore_that_undoes_it(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    sim = ["--simulate", "h200", "--sim-dir", str(tmp_path / "sim"), "--journal", str(journal)]
    first = autotune("host", "apply", "stable", "--apply", *sim)
    again = autotune("host", "apply", "stable", "--apply", *sim)
    assert first.returncode == 0, first.stderr
    assert again.returncode != 0
    text = "".join(again.stderr.split())  # rich folds a long path anywhere
    assert "".join(f"autotune host restore --journal {journal}".split()) in text
    assert "".join(f"--simulate h200 --sim-dir {tmp_path / 'sim'}".split()) in text
    restored = autotune("host", "restore", *sim)
    assert restored.returncode == 0, restored.stderr


def test_apply_then_restore_on_a_simulated_h200_from_the_command_line(tmp_path: Path) -> None:
    from host_tuning.apply import PersistentSimulatedNvml

    sim, journal = tmp_path / "sim", tmp_path / "journal.json"
    common = ["--simulate", "h200", "--sim-dir", str(sim), "--journal", str(journal), "--json"]
    applied = autotune("host", "apply", "stable", "--apply", *common)
    assert applied.returncode == 0, applied.stderr
    data = json.loads(applied.stdout)
    assert data["applied"] is True and data["journal"] == str(journal)
    assert "planned" not in {c["status"] for c in data["changes"]}  # each as it ended
    assert "applied" in {c["status"] for c in data["changes"]}
    device = PersistentSimulatedNvml("h200-passthrough-vm", sim / "nvml-state.jsonl")
    locked = device.locked_clocks(0)
    assert locked, "the stable profile locks clocks"

    again = autotune("host", "apply", "stable", "--apply", *common)
    assert again.returncode == 1 and "restore" in again.stderr

    restored = autotune("host", "restore", *common[:-1], "--json")
    assert restored.returncode == 0, restored.stderr
    device = PersistentSimulatedNvml("h200-passthrough-vm", sim / "nvml-state.jsonl")
    assert not any(device.locked_clocks(0).values())

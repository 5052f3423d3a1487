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

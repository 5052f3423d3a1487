"""The environment fingerprint: git state, lock hashes, versions, GPUs (ids redacted), host."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance.fingerprint import (
    collect_fingerprint,
    file_sha256,
    git_state,
    loaded_library,
    nix_store_path,
    redact_ids,
)
from appliance.report import validate_report
from host_tuning.nvml import SimulatedNvml
from tests.appliance.sample_report import sample_report

UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _in_report(fingerprint: dict) -> list:
    doc = sample_report()
    doc["fingerprint"] = fingerprint
    return validate_report(doc)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def h200() -> SimulatedNvml:
    return SimulatedNvml.from_fixture("h200-passthrough-vm")


def test_fingerprint_of_this_checkout_fits_the_schema_and_has_no_raw_ids() -> None:
    fp = collect_fingerprint()
    assert fp["git"]["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40,64}", fp["git"]["commit"])
    assert UUID.search(json.dumps(fp)) is None
    assert fp["ids_redacted"] is True
    assert fp["versions"]["python"]
    assert fp["host"]["hostname"]
    assert _in_report(fp) == []


def test_versions_come_from_the_imported_libraries() -> None:
    torch = pytest.importorskip("torch")
    versions = collect_fingerprint()["versions"]
    assert versions["torch"] == torch.__version__
    assert versions["cuda_runtime"] == torch.version.cuda


@needs_git
def test_git_state_follows_commits_and_edits(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "first")
    assert git_state(tmp_path) == {"commit": _git(tmp_path, "rev-parse", "HEAD"), "dirty": False}
    (tmp_path / "a.txt").write_text("two\n")
    assert git_state(tmp_path)["dirty"] is True


@needs_git
def test_a_repository_without_commits_has_an_unknown_commit(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "new.txt").write_text("x\n")
    assert git_state(tmp_path) == {"commit": "unknown", "dirty": True}


def test_outside_a_repository_the_commit_is_unknown(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"commit": "unknown", "dirty": None}
    fp = collect_fingerprint(tmp_path, nvml=SimulatedNvml.from_fixture("h200-passthrough-vm"))
    assert fp["git"] == {"commit": "unknown", "dirty": None}
    assert fp["locks"] == {"uv_lock_sha256": None, "flake_lock_sha256": None}


def test_lock_files_are_hashed(tmp_path: Path, h200: SimulatedNvml) -> None:
    (tmp_path / "uv.lock").write_text("version = 1\n")
    (tmp_path / "flake.lock").write_text('{"nodes": {}}\n')
    locks = collect_fingerprint(tmp_path, nvml=h200)["locks"]
    assert locks["uv_lock_sha256"] == hashlib.sha256(b"version = 1\n").hexdigest()
    assert locks["flake_lock_sha256"] == hashlib.sha256(b'{"nodes": {}}\n').hexdigest()
    assert file_sha256(tmp_path / "absent.lock") is None


def test_gpus_from_nvml_are_redacted_by_default(h200: SimulatedNvml) -> None:
    fp = collect_fingerprint(nvml=h200)
    (gpu,) = fp["gpus"]
    assert gpu["name"] == h200.read(0, "name").value
    assert gpu["vbios"] == h200.read(0, "vbios_version").value
    assert gpu["power_limit_w"] == h200.read(0, "power_limit_mw").value / 1000
    assert gpu["clocks_mhz"]["sm_max"] == h200.read(0, "clock_sm_max_mhz").value
    assert fp["versions"]["driver"] == h200.read_system("driver_version").value
    assert (gpu["uuid"], gpu["serial"]) == ("redacted", "redacted")
    assert h200.read(0, "uuid").value not in json.dumps(fp)
    assert UUID.search(json.dumps(fp)) is None
    assert fp["driver_library"] is None
    assert _in_report(fp) == []


def test_keep_ids_keeps_the_uuid(h200: SimulatedNvml) -> None:
    fp = collect_fingerprint(nvml=h200, keep_ids=True)
    assert fp["gpus"][0]["uuid"] == h200.read(0, "uuid").value
    assert fp["ids_redacted"] is False
    assert _in_report(fp) == []


def test_redact_ids_leaves_unknown_ids_null() -> None:
    gpu = {"index": 0, "name": "X", "uuid": None, "serial": "1320xx", "vbios": "1"}
    assert redact_ids(gpu, keep_ids=False) == {**gpu, "serial": "redacted"}
    assert redact_ids(gpu, keep_ids=True) == gpu


def test_nix_store_path_is_the_store_entry() -> None:
    inside = Path("/nix/store/abc123-autotune-0.1.0/lib/python3.11/site-packages/appliance")
    assert nix_store_path(inside) == "/nix/store/abc123-autotune-0.1.0"
    assert nix_store_path(Path("/usr/lib/python3")) is None
    assert nix_store_path(Path("/nix/store")) is None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_loaded_library_finds_a_mapped_library_and_hashes_it() -> None:
    found = loaded_library("libc.so")
    assert found is not None
    assert found["sha256"] == hashlib.sha256(Path(found["path"]).read_bytes()).hexdigest()
    assert loaded_library("libdoes-not-exist-anywhere.so") is None


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU")
def test_fingerprint_on_a_gpu_host_reads_the_real_driver() -> None:
    fp = collect_fingerprint()
    assert fp["gpus"], fp["note"]
    assert fp["versions"]["driver"]
    assert fp["gpus"][0]["vbios"]
    assert "libnvidia-ml.so" in fp["driver_library"]["path"]
    assert UUID.search(json.dumps(fp)) is None
    assert _in_report(fp) == []

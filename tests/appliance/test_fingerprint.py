"""The environment fingerprint: git state, lock hashes, versions, GPUs (ids redacted), host."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance.driver_discovery import default_roots, find_driver_libs
from appliance.fingerprint import (
    code_state,
    collect_fingerprint,
    driver_facts,
    file_sha256,
    git_state,
    loaded_library,
    nix_build,
    nix_store_path,
    redact_ids,
)
from appliance.report import validate_report
from host_tuning.nvml import SimulatedNvml
from tests.appliance.sample_report import sample_report
from tests.appliance.test_driver_discovery import install_driver

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


STORE_ENTRY = "/nix/store/" + "a" * 32 + "-autotune"
PACKAGE_ENTRY = "/nix/store/" + "b" * 32 + "-autotune-appliance-0.1.0"
REV = "0123456789abcdef0123456789abcdef01234567"


def _wrapper_env(**overrides: str) -> dict[str, str]:
    """The variables nix/run-with-driver.sh exports, as a Nix run sees them."""
    return {
        "AUTOTUNE_NIX_STORE_PATH": STORE_ENTRY,
        "AUTOTUNE_NIX_FLAKE_REV": REV,
        "AUTOTUNE_NIX_FLAKE_NARHASH": "sha256-Zm9vYmFyZm9vYmFyZm9vYmFyZm9vYmFyZm9vYmFyZm8=",
        "AUTOTUNE_NIX_NIXPKGS_REV": "0182a361324364ae3f436a63005877674cf45efb",
        "AUTOTUNE_NIX_FLAKE_LOCK_SHA256": "c" * 64,
        "AUTOTUNE_NIX_UV_LOCK_SHA256": "d" * 64,
        **overrides,
    }


def test_a_nix_run_records_the_flake_and_nixpkgs_revisions() -> None:
    nix = nix_build(_wrapper_env(), PACKAGE_ENTRY)
    assert nix is not None
    assert nix.store_path == STORE_ENTRY
    assert (nix.flake_revision, nix.flake_dirty, nix.commit) == (REV, False, REV)
    assert nix.flake_narhash == _wrapper_env()["AUTOTUNE_NIX_FLAKE_NARHASH"]
    assert nix.nixpkgs_revision == "0182a361324364ae3f436a63005877674cf45efb"

    git, locks = code_state(None, nix)
    assert git == {"commit": REV, "dirty": False}
    assert locks == {"uv_lock_sha256": "d" * 64, "flake_lock_sha256": "c" * 64}


@pytest.mark.parametrize(
    ("revision", "recorded", "commit"),
    [
        (REV + "-dirty", REV + "-dirty", REV),
        ("dirty", "dirty", "unknown"),
        ("", "dirty", "unknown"),
        ("not-a-revision", "dirty", "unknown"),
    ],
)
def test_an_uncommitted_flake_is_dirty(revision: str, recorded: str, commit: str) -> None:
    nix = nix_build(_wrapper_env(AUTOTUNE_NIX_FLAKE_REV=revision), PACKAGE_ENTRY)
    assert nix is not None
    assert (nix.flake_revision, nix.flake_dirty, nix.commit) == (recorded, True, commit)
    assert code_state(None, nix)[0] == {"commit": commit, "dirty": True}


def test_nix_variables_are_ignored_outside_the_nix_store_or_when_malformed(
    tmp_path: Path, h200: SimulatedNvml
) -> None:
    assert nix_build(_wrapper_env(), None) is None
    assert nix_build(_wrapper_env(AUTOTUNE_NIX_STORE_PATH="/tmp/x"), PACKAGE_ENTRY) is None
    assert nix_build({}, PACKAGE_ENTRY) is None
    odd = nix_build(
        _wrapper_env(AUTOTUNE_NIX_NIXPKGS_REV="unknown", AUTOTUNE_NIX_UV_LOCK_SHA256="zz"),
        PACKAGE_ENTRY,
    )
    assert odd is not None and (odd.nixpkgs_revision, odd.uv_lock_sha256) == (None, None)

    # This checkout is not in the Nix store: inherited variables must not describe it.
    fp = collect_fingerprint(tmp_path, nvml=h200, environ=_wrapper_env())
    assert fp["nix"] is None and fp["nix_store_path"] is None
    assert fp["git"] == {"commit": "unknown", "dirty": None}
    assert _in_report(fp) == []


def test_the_fingerprint_names_the_driver_files_and_their_hashes(
    tmp_path: Path, h200: SimulatedNvml
) -> None:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    install_driver(lib, "580.95.05", content=b"\x7fELF driver 580.95.05")
    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)
    private = str(tmp_path / "private")

    fp = collect_fingerprint(
        tmp_path, nvml=h200, driver=libs, environ={"AUTOTUNE_DRIVER_DIR": private}
    )

    driver = fp["driver"]
    assert driver == driver_facts(libs, private)
    assert (driver["found"], driver["version"], driver["source"]) == (
        True,
        "580.95.05",
        "directory",
    )
    assert driver["directory"] == str(lib) and driver["exposed_dir"] == private
    digest = hashlib.sha256(b"\x7fELF driver 580.95.05").hexdigest()
    assert {x["soname"]: x["path"] for x in driver["libraries"]} == {
        "libcuda.so.1": str(lib / "libcuda.so.580.95.05"),
        "libnvidia-ml.so.1": str(lib / "libnvidia-ml.so.580.95.05"),
        "libnvidia-ptxjitcompiler.so.1": str(lib / "libnvidia-ptxjitcompiler.so.580.95.05"),
    }
    assert all(x["sha256"] == digest for x in driver["libraries"])
    # NVML's own answer wins over the file name for the version.
    assert fp["versions"]["driver"] == h200.read_system("driver_version").value
    assert _in_report(fp) == []


def test_without_nvml_the_driver_version_comes_from_the_driver_files(tmp_path: Path) -> None:
    from host_tuning.nvml import probe_nvml

    probe = probe_nvml()
    if probe.backend is not None:
        probe.backend.close()
        pytest.skip("this host has NVML, which answers the driver version itself")
    install_driver(tmp_path / "usr/lib64", "570.172.08")
    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)
    fp = collect_fingerprint(tmp_path, driver=libs, environ={})
    assert fp["versions"]["driver"] == "570.172.08"
    assert fp["driver"]["exposed_dir"] is None
    assert fp["gpus"] == [] and fp["note"]


def test_no_driver_is_recorded_as_not_found(tmp_path: Path, h200: SimulatedNvml) -> None:
    libs = find_driver_libs(default_roots(tmp_path), "", kernel_version_file=None)
    driver = collect_fingerprint(tmp_path, nvml=h200, driver=libs, environ={})["driver"]
    assert (driver["found"], driver["version"], driver["libraries"]) == (False, None, [])
    assert driver["source"] == "none"


@pytest.mark.gpu
def test_fingerprint_on_a_gpu_host_reads_the_real_driver() -> None:
    fp = collect_fingerprint()
    assert fp["gpus"], fp["note"]
    assert fp["versions"]["driver"]
    assert fp["gpus"][0]["vbios"]
    assert "libnvidia-ml.so" in fp["driver_library"]["path"]
    assert fp["driver"]["found"] and fp["driver"]["version"] == fp["versions"]["driver"]
    loaded_nvml = Path(fp["driver_library"]["path"]).resolve()
    assert str(loaded_nvml) in {x["path"] for x in fp["driver"]["libraries"]}
    assert UUID.search(json.dumps(fp)) is None
    assert _in_report(fp) == []

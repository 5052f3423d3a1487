"""`autotune fleet` against real OpenSSH servers on loopback addresses: provision twice (the
second changes nothing), check, baseline, collect; hosts that are down, unprovisioned, failing
or too slow are reported while the others finish; unknown and changed host keys are refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from appliance.cli import main
from appliance.fleet.bundle import default_source, shipped_files
from tests.appliance.fleet.conftest import (
    Server,
    base_python,
    free_port,
    keygen,
    uv_binary,
    uv_cache_dir,
)


def hosts_toml(servers: list[Server], key: Path, extra: str = "") -> str:
    uv = uv_binary()
    lines = [
        "[defaults]",
        f'key = "{key}"',
        'install = "uv"',
        f'uv = "{uv}"',
        "uv_offline = true",
        "connect_timeout = 5",
        "",
    ]
    for s in servers:
        lines += [
            f"[hosts.{s.name}]",
            f'host = "{s.address}"',
            f"port = {s.port}",
            f'tags = ["test", "{s.name}-only"]',
            f'dir = "{s.root / "appliance"}"',
            f"[hosts.{s.name}.env]",
            # The test hosts install from this machine's uv cache, offline, with symlinks
            # (the cache may sit on another file system than the temporary directories).
            f'UV_CACHE_DIR = "{uv_cache_dir(uv)}"',
            f'UV_PYTHON = "{base_python()}"',
            'UV_LINK_MODE = "symlink"',
            "",
        ]
    return "\n".join(lines) + extra


def fleet(*args: str) -> tuple[int, dict | None, str]:
    result = CliRunner().invoke(main, ["fleet", *args], catch_exceptions=False)
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        data = None
    return result.exit_code, data, result.stderr


def by_host(data: dict) -> dict[str, dict]:
    return {h["host"]: h for h in data["hosts"]}


@pytest.fixture(scope="module")
def fleet_files(tmp_path_factory, servers, user_key) -> dict[str, Path]:
    """A hosts file for a, b and c, and a known_hosts file that holds their real keys."""
    base = tmp_path_factory.mktemp("fleet")
    hosts = base / "hosts.toml"
    hosts.write_text(hosts_toml(list(servers.values()), user_key))
    known = base / "known_hosts"
    known.write_text("".join(s.known_hosts_line for s in servers.values()))
    return {"hosts": hosts, "known_hosts": known, "base": base}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A snapshot of this checkout's shipped files (others may edit the checkout meanwhile)."""
    root = tmp_path_factory.mktemp("source")
    for rel in shipped_files(default_source()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(default_source() / rel, root / rel)
    return root


@pytest.fixture(scope="module")
def provisioned(fleet_files, source) -> dict:
    """The first provisioning of a and b (c stays bare: a host whose commands fail)."""
    code, data, err = fleet(
        "provision",
        "--source",
        str(source),
        "--hosts",
        str(fleet_files["hosts"]),
        "--known-hosts",
        str(fleet_files["known_hosts"]),
        "--limit",
        "a-only",
        "--limit",
        "b",
        "--json",
    )
    assert code == 0, err
    return data


def common(files: dict[str, Path], *limits: str) -> list[str]:
    args = ["--hosts", str(files["hosts"]), "--known-hosts", str(files["known_hosts"]), "--json"]
    for limit in limits:
        args += ["--limit", limit]
    return args


def test_provision_installs_then_changes_nothing(
    provisioned, fleet_files, servers, source, tmp_path
):
    first = by_host(provisioned)
    assert set(first) == {"a", "b"}
    for name, result in first.items():
        assert result["status"] == "ok"
        assert result["data"]["changed"] is True
        assert result["data"]["method"] == "uv"
        stamp = json.loads((servers[name].root / "appliance" / "stamp.json").read_text())
        assert stamp["source_sha256"] == provisioned["source_sha256"]
        assert (servers[name].root / "appliance" / "bin" / "autotune").exists()

    code, again, err = fleet("provision", "--source", str(source), *common(fleet_files, "a", "b"))
    assert code == 0, err
    for result in again["hosts"]:
        assert result["status"] == "ok"
        assert result["reason"] == "no change"
        assert result["data"]["changed"] is False
    assert again["source_sha256"] == provisioned["source_sha256"]

    edited = tmp_path / "edited"
    shutil.copytree(source, edited)
    (edited / "README.md").write_text("an edited checkout\n")
    code, changed, err = fleet("provision", "--source", str(edited), *common(fleet_files, "a"))
    assert code == 0, err
    (result,) = changed["hosts"]
    assert result["data"]["changed"] is True
    assert result["reason"] == f"installed with uv (was {provisioned['source_sha256'][:12]})"


def test_check_baseline_collect(provisioned, fleet_files, tmp_path):
    code, checked, err = fleet("check", *common(fleet_files, "a", "b"))
    assert code == 0, err
    hosts = by_host(checked)
    for name in ("a", "b"):
        assert hosts[name]["status"] == "ok"
        assert {"facts", "checks", "note"} <= set(hosts[name]["data"])
    assert [r["host"] for r in checked["report"]["hosts"]] == ["a", "b"]

    code, measured, err = fleet(
        "baseline", *common(fleet_files, "a"), "--quick", "--device", "cpu", "--run-id", "r1"
    )
    assert code == 0, err
    metrics = by_host(measured)["a"]["data"]["metrics"]
    assert any(m["unit"] == "GB/s" for m in metrics)
    assert "host_memory_bandwidth" in measured["report"]["hosts"][0]["baselines"]

    out = tmp_path / "collected"
    code, collected, err = fleet("collect", *common(fleet_files, "a", "b"), "--out", str(out))
    assert code == 0, collected["hosts"]
    a, b = by_host(collected)["a"], by_host(collected)["b"]
    assert a["data"]["run"] == "r1"
    assert "baseline.json" in a["data"]["files"]
    fetched = json.loads((out / "a" / "run" / "baseline.json").read_text())
    assert fetched["metrics"] == metrics
    assert json.loads((out / "a" / "host-check.json").read_text())["checks"]
    assert json.loads((out / "b" / "host-check.json").read_text())["checks"]
    assert b["data"]["files"] == [] and "no run directory" in b["notes"][0]
    report = json.loads((out / "fleet.json").read_text())["report"]
    assert [h["host"] for h in report["hosts"]] == ["a", "b"]
    assert "host_memory_bandwidth" in report["hosts"][0]["baselines"]
    assert "| a |" in (out / "fleet.md").read_text()


def test_down_and_failing_hosts_are_reported_while_others_finish(
    provisioned, fleet_files, servers, user_key, tmp_path
):
    down = Server("down", "127.0.0.5", free_port("127.0.0.5"), tmp_path / "down", "")
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(hosts_toml([servers["a"], servers["c"], down], user_key))
    files = {"hosts": hosts, "known_hosts": fleet_files["known_hosts"]}

    code, data, _ = fleet("check", *common(files))
    assert code == 1
    results = by_host(data)
    assert results["a"]["status"] == "ok"
    assert results["c"]["status"] == "failed"
    assert "not installed" in results["c"]["reason"]
    assert results["down"]["status"] == "unreachable"
    assert "refused" in results["down"]["reason"]
    flagged = {h["host"]: h["flags"] for h in data["report"]["hosts"]}
    assert flagged["down"] and flagged["c"] and not any("unreachable" in f for f in flagged["a"])


def test_an_unknown_task_is_refused_before_any_host(fleet_files):
    code, _, text = fleet("run", *common(fleet_files, "a", "b"), "--task", "no-such-task")
    assert code == 2 and "unknown task 'no-such-task'" in text


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="the loopback hosts have a GPU here"
)
def test_failed_remote_command_reports_its_reason(provisioned, fleet_files):
    code, data, _ = fleet(
        "run",
        *common(fleet_files, "a", "b"),
        "--device",
        "cuda",
        "--store",
        "postgresql+psycopg://autotune@127.0.0.1:1/study",
    )
    assert code == 1
    assert data["store"] == "postgresql+psycopg://autotune@127.0.0.1:1/study"
    for result in data["hosts"]:
        assert result["status"] == "failed"
        assert result["exit_code"] == 2
        assert "no CUDA GPU is visible" in result["reason"]


def test_command_past_its_limit_is_killed_and_reported(provisioned, fleet_files):
    code, data, _ = fleet(
        "baseline",
        *common(fleet_files, "b"),
        "--device",
        "cpu",
        "--command-timeout",
        "1",
    )
    assert code == 1
    result = by_host(data)["b"]
    assert result["status"] == "timeout"
    assert "timed out after 1 s" in result["reason"]


def test_changed_host_key_is_refused(servers, fleet_files, tmp_path):
    impostor = keygen(tmp_path / "other_host_key")
    known = tmp_path / "known_hosts"
    a, b = servers["a"], servers["b"]
    known.write_text(f"[{a.address}]:{a.port} {impostor}\n" + b.known_hosts_line)
    files = {"hosts": fleet_files["hosts"], "known_hosts": known}

    for trust in ([], ["--trust-new-host-keys"]):
        code, data, _ = fleet("check", *common(files, "a", "b"), *trust)
        assert code == 1
        results = by_host(data)
        assert results["a"]["status"] == "host-key"
        assert "changed" in results["a"]["reason"]
        assert results["b"]["status"] != "host-key"
    assert known.read_text().count(a.address) == 1


def test_unknown_host_key_needs_explicit_trust(servers, fleet_files, tmp_path):
    known = tmp_path / "ssh" / "known_hosts"
    files = {"hosts": fleet_files["hosts"], "known_hosts": known}

    code, data, _ = fleet("check", *common(files, "c"))
    assert code == 1
    assert by_host(data)["c"]["status"] == "host-key"
    assert "--trust-new-host-keys" in by_host(data)["c"]["reason"]
    assert not known.exists()

    code, data, _ = fleet("check", *common(files, "c"), "--trust-new-host-keys")
    assert by_host(data)["c"]["status"] == "failed"  # connected; c has no appliance
    recorded = known.read_text()
    assert f"[{servers['c'].address}]:{servers['c'].port}" in recorded
    assert servers["c"].host_key_line in recorded

    code, data, _ = fleet("check", *common(files, "c"))
    assert by_host(data)["c"]["status"] == "failed"


def test_malformed_hosts_file_names_line_and_field(tmp_path):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.a]\nhost = "127.0.0.2"\nport = "22"\n')
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "fleet", "check", "--hosts", str(hosts)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"{hosts}:3: hosts.a.port: '22' is not of type 'integer'" in result.stderr
    assert "Traceback" not in result.stderr


def test_two_hosts_run_one_postgresql_study_then_collect(
    provisioned, fleet_files, tmp_path, postgres_url
):
    """`fleet run --store URL`: both hosts' loops search one study on a real PostgreSQL server,
    never the same configuration twice, within one trial budget; collect brings both back."""
    import optuna

    from tests.postgres_server import create_database

    store = create_database(postgres_url, "fleet_study")
    code, data, _ = fleet(
        "run",
        *common(fleet_files, "a", "b"),
        "--store",
        store,
        "--task",
        "rmsnorm",
        "--trials",
        "4",
        "--quick",
        "--device",
        "cpu",
        "--run-id",
        "shared",
    )
    assert code == 0, data["hosts"]
    assert all(h["data"]["valid"] for h in data["hosts"])
    studies = optuna.get_all_study_summaries(storage=store)
    assert len(studies) == 1
    trials = optuna.load_study(study_name=studies[0].study_name, storage=store).get_trials()
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert 0 < len(finished) <= 4
    configs = [tuple(sorted(t.params.items())) for t in finished]
    assert len(configs) == len(set(configs)), "a configuration was evaluated twice"
    out = tmp_path / "collected"
    code, collected, _ = fleet("collect", *common(fleet_files, "a", "b"), "--out", str(out))
    assert code == 0, collected["hosts"]
    for name in ("a", "b"):
        report = json.loads((out / name / "run" / "report.json").read_text())
        assert report["loop"]["store"].startswith("postgresql")
    assert json.loads((out / "fleet.json").read_text())["report"]["hosts"][0]["baselines"]

"""The hosts file: defaults and per-host overrides, --limit, and errors that name the line and
the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.fleet.inventory import (
    DEFAULT_DIR,
    InventoryError,
    key_lines,
    load_inventory,
    select_hosts,
)

GOOD = """\
known_hosts = "ssh/known_hosts"

[defaults]
user = "ubuntu"
key = "id_test"
connect_timeout = 7
tags = ["rented"]

[hosts.gpu-a]
host = "203.0.113.10"
tags = ["h200", "eu"]

[hosts."gpu.b"]
host = "gpu-b.example.net"
port = 2222
user = "root"
dir = "~/fleet"
device = "cpu"
command_timeout = 60
[hosts."gpu.b".env]
CUDA_VISIBLE_DEVICES = "0"
"""


def write(tmp_path: Path, text: str, key: bool = True) -> Path:
    if key:
        (tmp_path / "id_test").write_text("not read here")
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return caught.value.errors


def test_defaults_apply_and_hosts_override(tmp_path):
    inv = load_inventory(write(tmp_path, GOOD))
    a, b = inv.hosts
    assert inv.known_hosts == tmp_path / "ssh" / "known_hosts"
    assert (a.name, a.host, a.port, a.user) == ("gpu-a", "203.0.113.10", 22, "ubuntu")
    assert a.key == tmp_path / "id_test"
    assert a.tags == ("h200", "eu")
    assert a.connect_timeout == 7 and a.command_timeout is None
    assert a.dir == DEFAULT_DIR and a.install == "auto" and a.device == "auto"
    assert (b.name, b.port, b.user, b.device) == ("gpu.b", 2222, "root", "cpu")
    assert b.tags == ("rented",)
    assert b.dir == "fleet"  # ~/ is made relative to the login directory
    assert b.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert b.line == 13


def test_limit_by_tag_or_name(tmp_path):
    inv = load_inventory(write(tmp_path, GOOD))
    assert [h.name for h in select_hosts(inv, ())] == ["gpu-a", "gpu.b"]
    assert [h.name for h in select_hosts(inv, ("h200",))] == ["gpu-a"]
    assert [h.name for h in select_hosts(inv, ("gpu.b", "eu"))] == ["gpu-a", "gpu.b"]
    with pytest.raises(InventoryError, match=r"no host has the name or tag nope \(tags: eu, h200"):
        select_hosts(inv, ("nope",))


def test_wrong_type_names_line_and_field(tmp_path):
    path = write(tmp_path, GOOD.replace("port = 2222", 'port = "2222"'))
    assert errors_of(path) == [f"{path}:15: hosts.\"gpu.b\".port: '2222' is not of type 'integer'"]


def test_unknown_field_names_its_line(tmp_path):
    path = write(tmp_path, GOOD.replace('device = "cpu"', "prot = 22"))
    (error,) = errors_of(path)
    assert error.startswith(f'{path}:18: hosts."gpu.b".prot: unknown field (allowed: ')
    assert "port" in error


def test_missing_host_names_the_table(tmp_path):
    path = write(tmp_path, GOOD + '\n[hosts.gpu-c]\nuser = "x"\n')
    assert errors_of(path) == [f"{path}:23: hosts.gpu-c: 'host' is a required property"]


def test_every_problem_is_listed_in_line_order(tmp_path):
    text = GOOD.replace("connect_timeout = 7", "connect_timeout = 0").replace(
        'CUDA_VISIBLE_DEVICES = "0"', "CUDA_VISIBLE_DEVICES = 0"
    )
    errors = errors_of(write(tmp_path, text))
    assert [e.split(": ", 2)[0].rsplit(":", 1)[1] for e in errors] == ["6", "21"]
    assert "defaults.connect_timeout" in errors[0]
    assert 'hosts."gpu.b".env.CUDA_VISIBLE_DEVICES' in errors[1]


def test_bad_values_are_refused(tmp_path):
    for bad, field in (
        ('host = "-oProxyCommand=x"', "host"),
        ('install = "pip"', "install"),
        ("port = 70000", "port"),
        ('tags = ["a b"]', "tags.0"),
    ):
        text = GOOD.replace('tags = ["h200", "eu"]', bad)
        if bad.startswith("host"):
            text = GOOD.replace('host = "203.0.113.10"', bad)
        (error,) = errors_of(write(tmp_path, text))
        assert f":{10 if field == 'host' else 11}: hosts.gpu-a.{field}:" in error


def test_bad_host_name(tmp_path):
    (error,) = errors_of(write(tmp_path, GOOD.replace("[hosts.gpu-a]", '[hosts."../x"]')))
    assert '"../x"' in error and ":9:" in error


def test_toml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, GOOD.replace("port = 2222", "port = = 2222"))
    (error,) = errors_of(path)
    assert error.startswith(f"{path}: not valid TOML") and "line 15" in error


def test_missing_key_file_names_the_line(tmp_path):
    path = write(tmp_path, GOOD, key=False)
    errors = errors_of(path)
    assert errors[0].startswith(f"{path}:5: defaults.key: key file ")
    assert len(errors) == 2


def test_no_hosts(tmp_path):
    path = write(tmp_path, "[defaults]\nport = 22\n")
    assert errors_of(path) == [f"{path}:1: top level: 'hosts' is a required property"]


def test_key_lines_reads_headers_dotted_and_quoted_keys():
    text = '[a]\nx = 1\n"y.z".w = 2\n[a."b c"]\nq = { r = 1 }\n[[arr]]\nk = 1\n[[arr]]\nk = 2\n'
    lines = key_lines(text)
    assert lines[("a",)] == 1 and lines[("a", "x")] == 2
    assert lines[("a", "y.z", "w")] == 3
    assert lines[("a", "b c", "q")] == 5
    assert lines[("arr", 1, "k")] == 9

"""How provisioning chooses: Nix where the host has it (unless the host says uv), uv otherwise,
and a clear failure when the host has neither."""

from __future__ import annotations

import pytest

from appliance.fleet.connection import HostFailure
from appliance.fleet.inventory import Host
from appliance.fleet.provision import Probe, choose_method


def host(install: str = "auto") -> Host:
    return Host(name="h", host="127.0.0.1", install=install)


def test_nix_when_present_uv_otherwise():
    both = Probe(nix="/nix/var/nix/profiles/default/bin/nix", uv="/usr/bin/uv", stamp=None)
    only_uv = Probe(nix="", uv="/usr/bin/uv", stamp=None)
    assert choose_method(host(), both) == ("nix", both.nix)
    assert choose_method(host("uv"), both) == ("uv", "/usr/bin/uv")
    assert choose_method(host(), only_uv) == ("uv", "/usr/bin/uv")


def test_missing_tools_are_a_host_failure():
    with pytest.raises(HostFailure, match="no nix on PATH"):
        choose_method(host("nix"), Probe(nix="", uv="/usr/bin/uv", stamp=None))
    with pytest.raises(HostFailure, match="neither nix nor uv") as caught:
        choose_method(host(), Probe(nix="", uv="", stamp=None))
    assert caught.value.status == "failed"

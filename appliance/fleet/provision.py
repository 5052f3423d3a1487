"""Install the appliance on a host the way the host allows: Nix when `nix` is there (a
flake build of the shipped source), uv otherwise (`uv sync --locked` into a venv on the host).

Idempotent: the host keeps a stamp with the shipped source's content hash and the method; when
both match and the installed `autotune` still starts, nothing is uploaded and the answer is
"no change".
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from appliance.fleet.bundle import Bundle
from appliance.fleet.connection import (
    HostFailure,
    SshOptions,
    command_timeout,
    failure_from,
    open_connection,
    run_script,
)
from appliance.fleet.inventory import Host
from appliance.fleet.parallel import HostResult

DEFAULT_TIMEOUT_S = 3600.0
PROBE_TIMEOUT_S = 60.0
UPLOAD_NAME = "upload.tar.gz"
STAMP_NAME = "stamp.json"

# Fixed scripts: user data reaches them only as quoted positional arguments.
PROBE = r"""
dir=$1; uv_hint=$2
echo "nix=$(command -v nix 2>/dev/null || true)"
uv=
for c in "$uv_hint" "$(command -v uv 2>/dev/null || true)" "$HOME/.local/bin/uv" "$HOME/.cargo/bin/uv"; do
  if [ -n "$c" ] && [ -x "$c" ]; then uv=$c; break; fi
done
echo "uv=$uv"
if [ -x "$dir/bin/autotune" ] && [ -f "$dir/stamp.json" ] && "$dir/bin/autotune" --version >/dev/null 2>&1; then
  echo "stamp=$(head -n 1 "$dir/stamp.json")"
fi
"""

UNPACK = r"""
set -e
dir=$1
rm -f "$dir/stamp.json"
rm -rf "$dir/src.new"
mkdir -p "$dir/src.new" "$dir/bin" "$dir/runs"
tar -xzf "$dir/upload.tar.gz" -C "$dir/src.new"
rm -rf "$dir/src"
mv "$dir/src.new" "$dir/src"
rm -f "$dir/upload.tar.gz"
"""

INSTALL_UV = r"""
set -e
dir=$1; uv=$2; shift 2
cd "$dir/src"
UV_PROJECT_ENVIRONMENT=../venv "$uv" sync --locked --no-dev --no-editable --quiet "$@"
cd ..
ln -sfn ../venv/bin/autotune bin/autotune
bin/autotune --version
"""

INSTALL_NIX = r"""
set -e
dir=$1; nix=$2
cd "$dir"
"$nix" --extra-experimental-features 'nix-command flakes' build \
  "path:$PWD/src#autotune-with-driver" --out-link nix-result
ln -sfn ../nix-result/bin/autotune bin/autotune
bin/autotune --version
"""

WRITE_STAMP = r"""
set -e
printf '%s\n' "$2" > "$1/stamp.json.tmp"
mv "$1/stamp.json.tmp" "$1/stamp.json"
"""


@dataclass(frozen=True)
class Probe:
    nix: str
    uv: str
    stamp: dict | None


def provision_host(host: Host, bundle: Bundle, opts: SshOptions) -> HostResult:
    """Install `bundle` on `host` unless its stamp says it is already there."""
    timeout = command_timeout(host, opts, DEFAULT_TIMEOUT_S)
    with open_connection(host, opts) as conn:
        probe = _probe(conn, host)
        method, tool = choose_method(host, probe)
        wanted = {"source_sha256": bundle.sha256, "method": method}
        data = {"method": method, "source_sha256": bundle.sha256, "dir": host.dir}
        if probe.stamp and all(probe.stamp.get(k) == v for k, v in wanted.items()):
            return HostResult(host.name, "ok", "no change", data={**data, "changed": False})
        run_script(conn, host, 'mkdir -p "$1"', [host.dir], PROBE_TIMEOUT_S)
        conn.put(io.BytesIO(bundle.data), remote=f"{host.dir}/{UPLOAD_NAME}")
        unpacked = run_script(conn, host, UNPACK, [host.dir], timeout)
        if unpacked.exit_code != 0:
            raise failure_from(unpacked, "unpacking the source")
        if method == "nix":
            done = run_script(conn, host, INSTALL_NIX, [host.dir, tool], timeout)
        else:
            extra = ["--offline"] if host.uv_offline else []
            done = run_script(conn, host, INSTALL_UV, [host.dir, tool, *extra], timeout)
        if done.exit_code != 0:
            raise failure_from(done, f"installing with {method}")
        stamp = {**wanted, "installed_at": datetime.now(UTC).isoformat(timespec="seconds")}
        written = run_script(
            conn, host, WRITE_STAMP, [host.dir, json.dumps(stamp)], PROBE_TIMEOUT_S
        )
        if written.exit_code != 0:
            raise failure_from(written, "writing the stamp")
        version = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        before = (probe.stamp or {}).get("source_sha256")
        reason = f"installed with {method}" + (f" (was {before[:12]})" if before else "")
        return HostResult(
            host.name, "ok", reason, data={**data, "changed": True, "version": version}
        )


def _probe(conn, host: Host) -> Probe:
    done = run_script(conn, host, PROBE, [host.dir, host.uv or ""], PROBE_TIMEOUT_S)
    if done.exit_code != 0:
        raise failure_from(done, "probing the host")
    values = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        values[key] = value.strip()
    try:
        stamp = json.loads(values["stamp"]) if values.get("stamp") else None
    except json.JSONDecodeError:
        stamp = None
    return Probe(values.get("nix", ""), values.get("uv", ""), stamp)


def choose_method(host: Host, probe: Probe) -> tuple[str, str]:
    """(method, path of its tool) for `host` as probed."""
    if host.install in ("auto", "nix") and probe.nix:
        return "nix", probe.nix
    if host.install == "nix":
        raise HostFailure("failed", 'install = "nix" but the host has no nix on PATH')
    if probe.uv:
        return "uv", probe.uv
    raise HostFailure(
        "failed",
        "the host has neither nix nor uv; install uv (https://docs.astral.sh/uv/) or Nix, "
        'or set uv = "/path/to/uv" for this host',
    )

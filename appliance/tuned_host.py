"""The host `autotune run --apply` tunes: which NVML device takes the profile, the pre-flight, and
the profile held for one measurement block and undone after it.

    host = open_tuned_host("stable", simulate="h200", out_dir=out)   # refuses clearly, early
    result = run_preflight(host)                                      # policy "refuse"
    with hold_profile(host):                                          # apply ... restore
        measure()

The write path is `host_tuning.apply` (journal flushed before each change, read-back, undone in
reverse order on exit, error, SIGINT or SIGTERM). `simulate` names a fixture of the simulated
NVML device (`h200`, `rtx4090`, or a full fixture name): its state lives in the run directory
and its CPU side is a copy of this host's cpufreq files, also in the run directory, so nothing
on the machine changes. Without `simulate` the real GPU 0 and the real CPU side are changed,
which needs root and the NVIDIA driver.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from appliance.output import EXIT_REJECTED, UsageFailure

JOURNAL_NAME = "host-journal.jsonl"
SIM_STATE_NAME = "simulated-nvml-state.jsonl"
SIM_CPU_ROOT = "simulated-host"
GPU_INDEX = 0

if TYPE_CHECKING:
    from baselines.preflight import PreflightResult
    from host_tuning.apply import ApplyResult
    from host_tuning.nvml_base import NvmlBackend
    from host_tuning.profiles import Change, Profile


class TuningRefused(click.ClickException):
    """The profile cannot be applied here (not root, no driver, open journal, pre-flight)."""

    exit_code = EXIT_REJECTED

    def show(self, file=None) -> None:
        click.echo(f"refused: {self.format_message()}", err=True)


@dataclass
class TunedHost:
    profile: Profile
    backend: NvmlBackend
    journal: Path
    cpu_root: Path
    nvml: str  # "real" or "simulated: FIXTURE"
    restore_hint: str
    first_apply: ApplyResult | None = None  # the first tuned block's apply
    applied_at: str | None = None
    restored_at: str | None = None
    restore_errors: list[str] = field(default_factory=list)
    blocks: int = 0
    preflight: PreflightResult | None = None

    @property
    def simulated(self) -> bool:
        return self.nvml != "real"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_fixture(name: str) -> str:
    """A fixture name from a full name or a unique prefix ("h200", "rtx4090"), or a JSON path."""
    from host_tuning.nvml_sim import fixture_names

    names = fixture_names()
    if name in names or name.endswith(".json"):
        return name
    matches = [n for n in names if n.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    raise UsageFailure(
        f"--simulate: unknown fixture {name!r}; shipped fixtures are {', '.join(names)} "
        "(a unique prefix such as 'h200' is enough), or give the path of a .json fixture"
    )


def simulated_cpu_root(dest: Path) -> Path:
    """A fresh copy of this host's CPU frequency files (governors, boost) under `dest`, so the
    profile's CPU side changes the copy; without cpufreq here (a VM) the copy has none either."""
    from host_tuning.fact import REAL_ROOT, read_text, under
    from host_tuning.settings import BOOST_FILES, CPU, governor_files

    if dest.exists():
        shutil.rmtree(dest)
    paths = [*governor_files(REAL_ROOT), f"{CPU}/cpu0/cpufreq/scaling_available_governors"]
    paths += [path for path, _ in BOOST_FILES]
    for path in paths:
        text = read_text(REAL_ROOT, path)
        if text.known:
            target = under(dest, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(text.value))
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def simulated_device(fixture: str, state: Path, cpu_dir: Path, fresh_cpu: bool = True):
    """The simulated NVML device of `fixture` (its writes kept in `state`) and a copy of this
    host's CPU frequency files under `cpu_dir` (taken afresh, or kept when `fresh_cpu` is
    False and one exists): the write path, with nothing on this machine changed."""
    from host_tuning.apply import PersistentSimulatedNvml

    try:
        backend = PersistentSimulatedNvml(resolve_fixture(fixture), state)
    except (ValueError, OSError) as exc:
        raise UsageFailure(f"--simulate: {exc}") from exc
    keep = not fresh_cpu and cpu_dir.exists()
    return backend, cpu_dir if keep else simulated_cpu_root(cpu_dir)


def _refuse_open_journal(journal: Path, hint: str) -> None:
    from host_tuning.journal import open_message, read_journal

    existing = read_journal(journal)
    if existing is not None and not existing.closed:
        raise TuningRefused(f"{open_message(existing)}; restore it first: {hint}")


def open_tuned_host(profile_name: str, simulate: str | None, out_dir: Path) -> TunedHost:
    """The profile and the device it will be applied to; refuses (TuningRefused, UsageFailure)
    before anything is measured or changed: unknown profile or fixture, the real GPU without
    root or driver, or a journal an earlier run left open."""
    from host_tuning.fact import REAL_ROOT
    from host_tuning.journal import JournalError, default_journal_path
    from host_tuning.nvml import probe_nvml
    from host_tuning.profiles import ProfileError, load_profile

    try:
        profile = load_profile(profile_name)
    except ProfileError as exc:
        raise UsageFailure(str(exc)) from exc
    try:
        if simulate is not None:
            fixture = resolve_fixture(simulate)
            journal = out_dir / JOURNAL_NAME
            state = out_dir / SIM_STATE_NAME
            cpu_root = out_dir / SIM_CPU_ROOT
            hint = (
                f"python -m host_tuning.apply --simulate {fixture} --state {state} "
                f"--journal {journal} --cpu-root {cpu_root} --restore"
            )
            _refuse_open_journal(journal, hint)
            backend, cpu = simulated_device(fixture, state, cpu_root)
            return TunedHost(profile, backend, journal, cpu, f"simulated: {fixture}", hint)
        journal = default_journal_path()
        hint = f"autotune host restore --journal {journal}"
        if os.geteuid() != 0:
            raise TuningRefused(
                "--apply changes the real GPU's clocks and power limit and the CPU governor, "
                "which needs root: run it with sudo, or add --simulate FIXTURE (e.g. h200) to "
                "exercise the apply/restore path on a simulated device"
            )
        probe = probe_nvml(writable=True)
        if probe.backend is None:
            raise TuningRefused(
                f"--apply needs the NVIDIA driver (NVML): {probe.reason}; add --simulate FIXTURE "
                "to exercise the apply/restore path on a simulated device"
            )
        _refuse_open_journal(journal, hint)
        return TunedHost(profile, probe.backend, journal, REAL_ROOT, "real", hint)
    except JournalError as exc:
        raise TuningRefused(str(exc)) from exc


def plan_changes(host: TunedHost) -> list[Change]:
    """The dry-run plan of the profile against the device it will be applied to."""
    from host_tuning.profiles import ProfileError, plan

    try:
        return plan(host.profile, host.backend, GPU_INDEX, cpu_root=host.cpu_root)
    except ProfileError as exc:
        raise TuningRefused(str(exc)) from exc


def run_preflight(host: TunedHost) -> PreflightResult:
    """Pre-flight of the GPU the profile goes to, policy "refuse". Persistence off only warns
    when the profile turns it on; clock locks are not checked (the profile sets them)."""
    from baselines.preflight import preflight

    per_finding = {}
    if host.profile.gpu.get("persistence_mode") is True:
        per_finding["persistence_off"] = "warn"
    return preflight(GPU_INDEX, policy="refuse", nvml=host.backend, per_finding=per_finding)


@contextmanager
def hold_profile(host: TunedHost) -> Iterator[ApplyResult]:
    """The profile applied for the block and restored after it (also on error, SIGINT, SIGTERM:
    `host_tuning.apply.profile_applied`). A restore that fails is recorded on `host` and
    raised as RestoreError; the journal then stays open for `restore_hint`."""
    from host_tuning.apply import RestoreError, profile_applied

    try:
        with profile_applied(
            host.profile, host.backend, host.journal, index=GPU_INDEX, cpu_root=host.cpu_root
        ) as result:
            host.blocks += 1
            if host.first_apply is None:
                host.first_apply = result
                host.applied_at = _now()
            yield result
    except RestoreError as exc:
        host.restore_errors.append(f"{exc} (restore with: {host.restore_hint})")
        raise
    host.restored_at = _now()


def journal_closed(host: TunedHost) -> bool:
    """No change of this run is left in place: no journal, or a closed one."""
    from host_tuning.journal import read_journal

    journal = read_journal(host.journal)
    return journal is None or journal.closed


def profile_report(host: TunedHost, planned: list[Change]) -> dict:
    """The report's `profile` block for an applied profile: the changes of the first apply (the
    plan when none was made), whether all were restored, the journal, the device."""
    from host_tuning.apply import report_section

    changes = host.first_apply.changes if host.first_apply is not None else planned
    restored = not host.restore_errors and journal_closed(host)
    section = report_section(host.profile.name, changes, applied=True, restored=restored)
    section.update(
        journal=str(host.journal),
        applied_at=host.applied_at,
        restored_at=host.restored_at if restored else None,
        restore_errors=list(host.restore_errors),
        nvml=host.nvml,
    )
    return section

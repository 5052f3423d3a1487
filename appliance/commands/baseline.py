"""`autotune baseline`: the host baseline suite, and `baseline compare` of two runs."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.commands.options import (
    DEVICE,
    JSON,
    OUT_FILE,
    write_json,
)
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    UsageFailure,
    console,
    emit_json,
    ensure_writable_dir,
    out_console,
)


@click.group(invoke_without_command=True, epilog=EXIT_CODES_HELP)
@OUT_FILE
@click.option("--quick", is_flag=True, help="Fewer samples (the CPU suite in seconds).")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=None,
    help="Fresh processes to run the suite in, one after another, pooling each metric's "
    "blocks, so that the interval covers what differs from one process to the next "
    "(where buffers landed, the GPU's thermal state). Default 5, or 1 with --quick.",
)
@DEVICE
@JSON
@click.pass_context
def baseline(
    ctx: click.Context,
    out_file: Path | None,
    quick: bool,
    processes: int | None,
    device: str,
    as_json: bool,
) -> None:
    """Measure the host's baselines: bandwidths, GEMM rate, launch latency, graph replay."""
    if ctx.invoked_subcommand is not None:
        return
    from appliance.devices import resolve_device
    from baselines.suite import render_result
    from baselines.suite_processes import DEFAULT_PROCESSES, SuiteProcessError, pooled_suite

    dev, note = resolve_device(device)
    if out_file is not None:  # before the suite, which takes minutes
        ensure_writable_dir(out_file.parent, "--out")
    if not as_json:
        console.print(note)
    try:
        result = pooled_suite(
            dev,
            quick=quick,
            processes=processes or (1 if quick else DEFAULT_PROCESSES),
            progress=None if as_json else lambda m: console.print(f"  {m}"),
        )
    except SuiteProcessError as exc:
        console.print(f"error: {exc}")
        ctx.exit(EXIT_REJECTED)
    if _saved_and_emitted(result.to_dict(), out_file, as_json):
        out_console.print(render_result(result))


@baseline.command("p2p", epilog=EXIT_CODES_HELP)
@OUT_FILE
@click.option("--quick", is_flag=True, help="Fewer sizes and samples.")
@JSON
def baseline_p2p(out_file: Path | None, quick: bool, as_json: bool) -> None:
    """Several GPUs: peer-to-peer support, bandwidth (copy engine and SM) and latency per GPU
    pair, NCCL all-reduce bus bandwidth from 4 KiB to 1 GiB, and the GPUs' topology."""
    from baselines.p2p import run_p2p_suite

    result = run_p2p_suite(
        quick=quick, progress=None if as_json else lambda m: console.print(f"  {m}")
    )
    data = result.to_dict()
    if _saved_and_emitted(data, out_file, as_json):
        for note in data.get("notes", []):
            console.print(note)
        out_console.print_json(data=data)


@baseline.command("compare", epilog=EXIT_CODES_HELP)
@click.argument("a")
@click.argument("b")
@JSON
def baseline_compare(a: str, b: str, as_json: bool) -> None:
    """Per-metric ratios of two baselines (for example bare metal against a VM).

    A and B are files written by `autotune baseline --out`, or the name of a shipped reference
    (`h200-kvm-passthrough`: the lent H200, a KVM guest with the GPU passed through).
    """
    from baselines.compare import compare_baselines, read_baseline, render_comparison

    try:
        cmp = compare_baselines(read_baseline(a), read_baseline(b))
    except ValueError as exc:
        raise UsageFailure(str(exc)) from exc
    if as_json:
        emit_json(cmp.to_dict())
    else:
        out_console.print(render_comparison(cmp))
        out_console.print(cmp.summary)


def _saved_and_emitted(data: dict, out_file: Path | None, as_json: bool) -> bool:
    """Write `data` to --out and, with --json, print it; True when the text view is wanted."""
    if out_file is not None:
        write_json(out_file, data)
    if as_json:
        emit_json(data)
    return not as_json

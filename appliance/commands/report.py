"""`autotune report ...`: validate, render, verify and compare speedup reports."""

from __future__ import annotations

from pathlib import Path

import click
from rich.text import Text

from appliance.commands.options import (
    JSON,
)
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    EXIT_USAGE,
    UsageFailure,
    console,
    emit_json,
    fmt_time,
    out_console,
)


@click.group()
def report() -> None:
    """Validate, render, verify and compare speedup reports."""


@report.command("validate", epilog=EXIT_CODES_HELP)
@click.argument("file", type=click.Path(path_type=Path))
@JSON
def report_validate(file: Path, as_json: bool) -> None:
    """Check FILE against the report JSON Schema; name every failing path. Exit 1 when it is
    not a valid report, 2 when it cannot be read or is not JSON."""
    from appliance.report.schema import read_json_file, validate_report

    doc, unreadable = read_json_file(file)
    errors = [str(e) for e in unreadable or validate_report(doc)]
    if as_json:
        emit_json({"file": str(file), "valid": not errors, "errors": errors})
    elif unreadable:  # bad input, as the other commands' usage errors
        raise UsageFailure("; ".join(errors))
    elif errors:
        out_console.print(Text.assemble(("invalid", "red"), f" {file}"))
        for e in errors:
            out_console.print(_literal(f"  {e}"))
    else:
        out_console.print(Text.assemble(("valid", "green"), f" {file}"))
    if errors:
        raise SystemExit(EXIT_USAGE if unreadable else EXIT_REJECTED)


def _literal(text: object) -> Text:
    """`text` as Rich prints it, read as no markup: report strings such as `[/x]` are data."""
    return Text(str(text))


def _load(file: Path) -> dict:
    """The report, validated and upgraded; an invalid one is bad input naming its paths."""
    from appliance.report import InvalidReport, load_report

    try:
        return load_report(file)
    except InvalidReport as exc:
        raise UsageFailure(f"{file}: {exc}") from exc


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageFailure(f"cannot write {path}: {exc.strerror}") from exc


@report.command("render", epilog=EXIT_CODES_HELP)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--html", "html_out", type=click.Path(path_type=Path), help="Write the HTML page.")
@click.option("--md", "md_out", type=click.Path(path_type=Path), help="Write the Markdown.")
def report_render(file: Path, html_out: Path | None, md_out: Path | None) -> None:
    """Render FILE as one self-contained HTML page (plots inline) and/or Markdown."""
    from appliance.report import render_html, render_markdown
    from appliance.report.schema import read_json_file, validate_report

    if html_out is None and md_out is None:
        raise UsageFailure("say where to write: --html OUT.html and/or --md OUT.md")
    doc, errors = read_json_file(file)  # the document as written: the page names its version
    errors = errors or validate_report(doc)
    if errors:
        lines = "\n".join(f"  {e}" for e in errors)
        raise UsageFailure(f"{file}: report is not valid ({len(errors)} errors):\n{lines}")
    if html_out is not None:
        _write(html_out, render_html(doc))
        out_console.print(_literal(f"html: {html_out}"))
    if md_out is not None:
        _write(md_out, render_markdown(doc))
        out_console.print(_literal(f"markdown: {md_out}"))


@report.command("verify", epilog=EXIT_CODES_HELP)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--quick", is_flag=True, help="Fewer timing blocks per shape (wider intervals).")
@click.option(
    "--tolerance",
    type=click.FloatRange(0, 1),
    default=None,
    help="Widen each claimed interval by this fraction [default: the report's noise floor, "
    "at least 0.01 and at most 0.5].",
)
@JSON
def report_verify(file: Path, quick: bool, tolerance: float | None, as_json: bool) -> None:
    """Re-measure every claim of FILE on this host: reproduced, not reproduced, or not comparable.

    Exit 0 when every comparable claim reproduced (and one was comparable), 1 otherwise.
    """
    from appliance.report.verify import verify_report

    doc = _load(file)
    say = None if as_json else _say
    result = verify_report(doc, quick=quick, tolerance=tolerance, progress=say)
    if as_json:
        emit_json({"file": str(file), **result.to_dict()})
    else:
        _print_verification(result)
    if not result.holds:
        raise SystemExit(EXIT_REJECTED)


def _say(message: str) -> None:
    console.print(_literal(f"  {message}"))


def _print_verification(result) -> None:
    from rich.table import Table

    colours = {"reproduced": "green", "not-reproduced": "red", "not-comparable": "yellow"}
    table = Table(title=f"claims (tolerance {result.tolerance:.3g})")
    for col in ("task", "shape", "candidate vs peer", "status", "claimed / measured"):
        table.add_column(_literal(col))
    for r in result.results:
        c = r.claim
        colour = colours[r.status]
        table.add_row(
            _literal(c.task),
            _literal(c.shape),
            _literal(f"{c.candidate} {c.params or ''} vs {c.peer}"),
            Text(r.status, style=colour),
            _literal(r.why),
        )
    out_console.print(table)
    for note in result.notes:
        out_console.print(_literal(f"  no claim: {note}"))
    counts = ", ".join(f"{n} {s}" for s, n in result.counts().items())
    out_console.print(f"{counts}; {'holds' if result.holds else 'does not hold'}")


@report.command("compare", epilog=EXIT_CODES_HELP)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@JSON
def report_compare(a: Path, b: Path, as_json: bool) -> None:
    """Put reports A and B side by side: per shape A's time / B's time, gains, environment."""
    from appliance.report.compare import compare_reports

    data = compare_reports(_load(a), _load(b))
    if as_json:
        emit_json({"a_file": str(a), "b_file": str(b), **data})
        return
    _print_comparison(data, a, b)


def _print_comparison(data: dict, a: Path, b: Path) -> None:
    from rich.table import Table

    for side, path in (("a", a), ("b", b)):
        s = data[side]
        out_console.print(
            _literal(
                f"{side.upper()}: {path} ({s['created']}, {s['hostname']}, "
                f"{s['gpu'] or 'no GPU'}, "
                f"profile {s['profile'] or 'none'} {s['profile_mode'] or ''})"
            )
        )
    table = Table(title="per shape: A time / B time (above 1: B faster)")
    for col in ("task", "shape", "A", "B", "A/B [interval]"):
        table.add_column(_literal(col))
    for r in data["shapes"]:
        interval = (
            f" [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if r["ci_low"] and r["ci_high"] else ""
        )
        table.add_row(
            _literal(r["task"]),
            _literal(r["shape"]),
            _literal(f"{fmt_time(r['a_s'])} {r['a_kernel']}"),
            _literal(f"{fmt_time(r['b_s'])} {r['b_kernel']}"),
            f"{r['ratio']:.3f}{interval}",
        )
    out_console.print(table)
    for side in ("a", "b"):
        for name in data[f"only_in_{side}"]:
            out_console.print(_literal(f"  only in {side.upper()}: {name}"))
    for name, sides in data["gains"].items():
        if sides["a"] or sides["b"]:
            out_console.print(f"  {name} gain: A {_gain(sides['a'])}, B {_gain(sides['b'])}")
    if data["environment"]:
        env = Table(title="environment differences")
        for col in ("field", "A", "B"):
            env.add_column(_literal(col))
        for d in data["environment"]:
            env.add_row(_literal(d["path"]), _literal(d["a"]), _literal(d["b"]))
        out_console.print(env)
    else:
        out_console.print("  same environment")


def _gain(g: dict | None) -> str:
    return "—" if g is None else f"{g['ratio']:.3f}x [{g['ci_low']:.3f}, {g['ci_high']:.3f}]"

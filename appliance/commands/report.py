"""`autotune report ...`: validate and render speedup reports."""

from __future__ import annotations

from pathlib import Path

import click

from appliance.commands.options import (
    JSON,
)
from appliance.output import (
    EXIT_CODES_HELP,
    EXIT_REJECTED,
    console,
    emit_json,
)


@click.group()
def report() -> None:
    """Validate and render speedup reports."""


@report.command("validate", epilog=EXIT_CODES_HELP)
@click.argument("file", type=click.Path(path_type=Path))
@JSON
def report_validate(file: Path, as_json: bool) -> None:
    """Check FILE against the report JSON Schema; name every failing path."""
    from appliance.report import validate_file

    errors = [str(e) for e in validate_file(file)]
    if as_json:
        emit_json({"file": str(file), "valid": not errors, "errors": errors})
    elif errors:
        console.print(f"[red]invalid[/red] {file}")
        for e in errors:
            console.print(f"  {e}")
    else:
        console.print(f"[green]valid[/green] {file}")
    if errors:
        raise SystemExit(EXIT_REJECTED)

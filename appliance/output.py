"""How commands speak: results on stdout (JSON with --json, rich tables otherwise), progress,
warnings and errors on stderr, with documented exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

EXIT_OK = 0
EXIT_REJECTED = 1  # a rejected candidate, a failed check, an invalid report
EXIT_USAGE = 2  # bad input: unknown task, missing file, malformed JSON, unwritable path
EXIT_INTERNAL = 3  # the tool itself failed

EXIT_CODES_HELP = (
    "Exit codes: 0 success or accepted; 1 rejected, failed or invalid; "
    "2 bad input (unknown task, missing file, malformed JSON, unwritable path); 3 internal error."
)

console = Console(stderr=True)  # progress, warnings, errors
out_console = Console()  # results


class UsageFailure(click.ClickException):
    """Bad input: printed as one line on stderr, exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def ensure_writable_dir(path: Path, option: str) -> None:
    """Create `path` if needed and prove it writable, or fail as bad input naming the option."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".autotune-write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageFailure(f"{option} {path} is not writable: {exc.strerror}") from exc


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=_default) + "\n")


def _default(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__fspath__"):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"

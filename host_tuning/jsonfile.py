"""Reading the project's JSON files (profiles, fixtures, baselines) with errors that name the
file and what it was meant to be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path, what: str, error: type[Exception] = ValueError) -> Any:
    """The parsed document; `error("cannot read <what> <path>: ...")` or `error("<what> <path>
    is not JSON: ...")` otherwise."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{what} {path} is not JSON: {err}") from None

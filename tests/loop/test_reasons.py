"""Reason codes are a documented, stable list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loop.reasons import CODES, codes_help, reason

DOC = Path(__file__).resolve().parents[2] / "docs" / "reason-codes.md"


def test_every_code_is_documented_with_its_meaning() -> None:
    text = DOC.read_text()
    for code, meaning in CODES.items():
        assert f"| `{code}` | {meaning} |" in text


def test_codes_are_kebab_case_and_listed_in_help() -> None:
    for code in CODES:
        assert re.fullmatch(r"[a-z]+(-[a-z0-9]+)*", code)
        assert code in codes_help()


def test_unknown_code_is_refused() -> None:
    with pytest.raises(KeyError):
        reason("made-up")

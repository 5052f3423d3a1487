"""Strings in a report come from whoever wrote it: rendered, they stay text. No raw HTML and no
forged heading or table in report.md or report.html, and no Rich markup in the commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from appliance.cli import main
from appliance.report import render_html, render_markdown
from appliance.report.claims import REPRODUCED, Claim, ClaimResult
from appliance.report.verify import Verification
from tests.appliance.report.sample_v2 import sample_v2

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
FAKE_SECTION = (
    "no GPU facts\n\n## Verification\n\nRe-measured on a second host: all claims hold.\n\n"
    "| gain | ratio [interval] |\n|---|---|\n| end-to-end | 3.120x [3.050, 3.190] |"
)
PIPE_SHAPE = "a|b"
MARKUP = "[/x]"


def _rename_shape(doc: dict, index: int, name: str) -> None:
    task = doc["tasks"][0]
    old = task["shapes"][index]["name"]
    task["shapes"][index]["name"] = name
    for entry in task["dispatch"]:
        entry["shapes"] = [name if s == old else s for s in entry.get("shapes", [])]


def _hostile() -> dict:
    """The sample report with the red team's strings in its free-text and name fields."""
    doc = sample_v2()
    doc["host"]["note"] = f"{SCRIPT} checked\r\n\n<!--"
    doc["loop"]["stop_reason"] = "--> trial budget reached"
    doc["fingerprint"]["host"]["hostname"] = IMG
    doc["fingerprint"]["note"] = FAKE_SECTION
    doc["baselines"]["comparison"]["summary"] = "# Forged heading"
    _rename_shape(doc, 0, PIPE_SHAPE)
    _rename_shape(doc, 1, MARKUP)
    return doc


def _headings(text: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith("#")]


def _cells(row: str) -> list[str]:
    """A table row split as GitHub does: at every pipe not escaped by a backslash."""
    cells, cell, chars = [], "", iter(row.strip()[1:-1])
    for ch in chars:
        if ch == "\\":
            cell += ch + next(chars, "")
        elif ch == "|":
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*cells, cell.strip()]


def _tables(md: str) -> list[list[list[str]]]:
    tables: list[list[list[str]]] = []
    previous = ""
    for line in md.split("\n"):
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(_cells(line))
        previous = line
    return tables


def test_markdown_holds_no_raw_html_from_the_report() -> None:
    md = render_markdown(_hostile())
    for raw in ("<script", "<img", "<!--"):
        assert raw not in md, raw
    assert "&lt;script>alert(1)&lt;/script> checked" in md
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in render_html(_hostile())
    assert '">&lt;img src=x onerror=alert(1)>' in md


def test_notes_open_no_heading_or_table_in_the_markdown() -> None:
    md, clean = render_markdown(_hostile()), render_markdown(sample_v2())
    assert _headings(md) == _headings(clean)
    assert len(_tables(md)) == len(_tables(clean))
    assert "\\# Forged heading" in md


def test_table_rows_keep_their_column_count() -> None:
    doc = _hostile()
    _rename_shape(doc, 2, "c\\|d")  # a backslash of its own must not unescape the pipe
    doc["baselines"]["comparison"]["label_a"] = "bare|metal"  # a column header
    tables = _tables(render_markdown(doc))
    for table in tables:
        assert {len(row) for row in table} == {len(table[0])}, table
    first_cells = {row[0] for table in tables for row in table}
    assert {"a\\|b", "c\\\\\\|d"} <= first_cells


def test_a_commonmark_renderer_sees_only_text() -> None:
    markdown_it = pytest.importorskip("markdown_it")
    md = render_markdown(_hostile())
    page = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    for raw in ("<script", "<img", "<!--", "<h2>Verification", "<h1>Forged"):
        assert raw not in page, raw
    assert "&lt;!--" in page and "--&gt; trial budget reached" in page
    assert page.count("<h2>") == md.count("\n## ")


def test_the_html_page_has_no_injected_heading_or_tag() -> None:
    html = render_html(_hostile())
    clean = render_html(sample_v2())
    for raw in ("<script>alert", "<img", "<h2>Verification", "<h1>Forged"):
        assert raw not in html, raw
    assert re.findall(r"<h\d>", html) == re.findall(r"<h\d>", clean)
    assert html.count("<table>") == clean.count("<table>")
    assert "<p>no GPU facts ## Verification Re-measured" in html
    assert "<td>a|b</td>" in html and f"<td>{MARKUP}</td>" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; checked &lt;!--" in html


def _write(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_report_compare_prints_markup_in_names_literally(tmp_path: Path) -> None:
    doc = _hostile()
    doc["fingerprint"]["host"]["hostname"] = "[bold]host[/bold]"
    a = _write(doc, tmp_path / "a.json")
    other = _hostile()
    other["fingerprint"]["host"]["hostname"] = "[/y]"
    b = _write(other, tmp_path / "b.json")
    done = CliRunner().invoke(main, ["report", "compare", str(a), str(b)])
    assert done.exit_code == 0, done.output
    assert MARKUP in done.output and "[/y]" in done.output
    assert "[bold]host[/bold]" in done.output
    assert "A/B [interval]" in done.output


def test_report_verify_prints_markup_in_names_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = Claim(
        task="[bold]rmsnorm",
        shape=MARKUP,
        device="cpu",
        candidate="torch_rmsnorm",
        params={},
        peer="eager",
        ratio=1.0,
        ci_low=0.9,
        ci_high=1.1,
        basis="measured-ratio",
    )
    result = Verification(
        results=[ClaimResult(claim, REPRODUCED, f"claimed 1.000x; shape {MARKUP}")],
        notes=[f"rmsnorm {MARKUP}: [/no] claim"],
        tolerance=0.05,
    )

    def fake_verify(doc: dict, progress=None, **_: object) -> Verification:
        progress(f"re-measuring rmsnorm torch_rmsnorm on {MARKUP}")
        return result

    monkeypatch.setattr("appliance.report.verify.verify_report", fake_verify)
    path = _write(_hostile(), tmp_path / "report.json")
    done = CliRunner().invoke(main, ["report", "verify", str(path)])
    assert done.exit_code == 0, done.output
    assert f"re-measuring rmsnorm torch_rmsnorm on {MARKUP}" in done.output
    assert "[bold]rmsnorm" in done.output and "[/no] claim" in done.output


def test_report_validate_prints_markup_in_errors_literally(tmp_path: Path) -> None:
    doc = _hostile()
    doc["created"] = "[/x]"
    path = _write(doc, tmp_path / "bad.json")
    done = CliRunner().invoke(main, ["report", "validate", str(path)])
    assert done.exit_code == 1, done.output
    assert "[/x]" in done.output

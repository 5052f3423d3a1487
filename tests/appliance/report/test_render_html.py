"""The HTML report: one self-contained page whose every plot is either drawn or says "not
measured"; checked in a real headless Chromium (DOM after scripts ran, console, screenshot)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from appliance.report import InvalidReport, render_html
from appliance.report.render_html import PLOT_IDS, markdown_to_html
from tests.appliance.report.sample_v2 import sample_v2
from tests.appliance.sample_report import sample_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


class _Figures(HTMLParser):
    """Per plot id: the classes of the elements inside its <figure>, and the text there."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict] = {}
        self.body: dict[str, str] = {}
        self.external: list[str] = []
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = {k: v for k, v in a.items() if v is not None}
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith(("#", "data:")):
                self.external.append(a[key])
        if tag == "figure" and a.get("id"):
            self.figures[a["id"]] = {"tags": [], "classes": [], "text": ""}
            self._stack.append(a["id"])
        elif self._stack:
            fig = self.figures[self._stack[-1]]
            fig["tags"].append(tag)
            fig["classes"] += (a.get("class") or "").split()

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure" and self._stack:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        if self._stack:
            self.figures[self._stack[-1]]["text"] += data


def _parse(html: str) -> _Figures:
    parser = _Figures()
    parser.feed(html)
    return parser


def _cpu_doc() -> dict:
    """A CPU run as schema v1 describes it: no GPU, no profile, no samples, no gains."""
    doc = sample_report()
    doc["fingerprint"]["gpus"] = []
    doc["host"]["gpu_present"] = False
    doc["profile"] = None
    del doc["gains"]
    for shape in doc["tasks"][0]["shapes"]:
        shape["winner"] = None
        shape["flops"] = 0  # a task that does not count its FLOPs: no roofline position
    return doc


def test_a_full_report_draws_every_plot() -> None:
    doc = sample_v2()
    page = _parse(render_html(doc))
    assert list(page.figures) == list(PLOT_IDS)
    for plot_id, fig in page.figures.items():
        assert "svg" in fig["tags"] and "chart" in fig["classes"], plot_id
        assert "not-measured" not in fig["classes"], plot_id
    speedup = page.figures["plot-speedup"]
    assert speedup["classes"].count("speedup-point") == 3  # shapes with a winner
    roof = page.figures["plot-roofline"]
    assert roof["classes"].count("roof-point") == 7 and "ceiling" in roof["classes"]
    assert page.figures["plot-noise"]["classes"].count("threshold") == 2
    assert {"clock-line", "temperature-line", "event"} <= set(
        page.figures["plot-telemetry"]["classes"]
    )
    assert page.figures["plot-virt"]["classes"].count("virt-point") == 2
    assert page.external == []


def test_missing_data_shows_a_visible_not_measured_note() -> None:
    page = _parse(render_html(_cpu_doc()))
    assert list(page.figures) == list(PLOT_IDS)
    for plot_id, fig in page.figures.items():
        assert "svg" not in fig["tags"], plot_id
        assert "not-measured" in fig["classes"]
        assert "Not measured:" in fig["text"], plot_id
    assert "no A/A samples" in page.figures["plot-noise"]["text"]
    assert "no baseline comparison" in page.figures["plot-virt"]["text"]


def test_text_from_the_report_is_escaped() -> None:
    doc = sample_v2()
    doc["host"]["checks"][0]["fix"] = "<script>alert(1)</script> | x"
    doc["tasks"][0]["shapes"][1]["name"] = "<b>4096</b>"
    doc["tasks"][0]["dispatch"][1]["shapes"] = ["<b>4096</b>"]
    html = render_html(doc)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; | x" in html
    assert "<b>4096</b>" not in html


def test_an_invalid_report_is_refused_with_paths() -> None:
    doc = sample_v2()
    doc["telemetry"]["samples"][0]["t_s"] = "soon"
    with pytest.raises(InvalidReport, match="telemetry/samples/0/t_s"):
        render_html(doc)


def test_markdown_subset_conversion() -> None:
    md = "## A `b`\n\ntext one\ntext two\n\n| x | y |\n|---|---|\n| a \\| b | `c` |\n\n- one\n- two\n\n```sh\necho <hi>\n```\n"
    html = markdown_to_html(md)
    assert "<h2>A <code>b</code></h2>" in html
    assert "<p>text one text two</p>" in html
    assert "<tr><td>a | b</td><td><code>c</code></td></tr>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert "<pre><code>echo &lt;hi&gt;</code></pre>" in html


def _chromium(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    cmd += ["--disable-extensions", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _console_errors(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if ":CONSOLE" in line and ("error" in line.lower() or "uncaught" in line.lower())
    ]


def _render_cli(report: dict, tmp_path: Path, name: str) -> Path:
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps(report))
    html, md = tmp_path / f"{name}.html", tmp_path / f"{name}.md"
    cmd = [sys.executable, "-m", "appliance", "report", "render", str(src)]
    done = subprocess.run(
        [*cmd, "--html", str(html), "--md", str(md)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert md.read_text().startswith("# autotune report")
    return html


@needs_chromium
def test_chromium_renders_every_plot_without_console_errors(tmp_path: Path) -> None:
    html = _render_cli(sample_v2(), tmp_path, "full")
    done = _chromium("--dump-dom", html.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_errors(done.stderr) == []
    page = _parse(done.stdout)
    assert page.body.get("data-ready") == "1", "the inline script did not run"
    assert page.body["data-plots"] == str(len(PLOT_IDS))
    assert page.body["data-plots-drawn"] == str(len(PLOT_IDS))
    for plot_id in PLOT_IDS:
        assert "svg" in page.figures[plot_id]["tags"], plot_id
    shot = tmp_path / "full.png"
    done = _chromium(
        "--hide-scrollbars", "--window-size=1200,2400", f"--screenshot={shot}", html.as_uri()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 2400)
    assert len(data) > 50_000, "a blank page compresses to a few kB"


@needs_chromium
def test_chromium_shows_not_measured_notes_for_a_cpu_report(tmp_path: Path) -> None:
    html = _render_cli(_cpu_doc(), tmp_path, "cpu")
    done = _chromium("--dump-dom", html.as_uri())
    assert done.returncode == 0
    assert _console_errors(done.stderr) == []
    page = _parse(done.stdout)
    assert page.body["data-plots"] == str(len(PLOT_IDS))
    assert page.body["data-plots-drawn"] == "0"
    assert all("Not measured:" in f["text"] for f in page.figures.values())


@needs_chromium
def test_the_console_check_does_catch_an_error(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    done = _chromium("--dump-dom", page.as_uri())
    assert any(re.search(r"Uncaught ReferenceError", line) for line in _console_errors(done.stderr))

"""Render a report as one self-contained HTML page: inline CSS, inline SVG plots, a few lines of
inline script, no network. The text sections are the Markdown rendering, converted here (only
the subset `render_md` writes: headings, tables, code fences, lists, paragraphs, `code`)."""

from __future__ import annotations

import re
from html import escape, unescape

from appliance.report.document import checked
from appliance.report.plots import Plot, all_plots
from appliance.report.render_md import render_markdown

PLOT_IDS = ("plot-speedup", "plot-roofline", "plot-noise", "plot-telemetry", "plot-virt")

_CSS = """
:root { --fg:#1d2433; --muted:#5b6477; --line:#d5dae3; --accent:#2f6fdb; --warn:#c2410c; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
       margin: 0 auto; max-width: 1100px; padding: 24px; }
h1 { margin-bottom: 4px; } h2 { border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.sub { color: var(--muted); margin-top: 0; }
.headline { display: flex; gap: 16px; flex-wrap: wrap; margin: 16px 0; }
.gain { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 180px; }
.gain b { display: block; font-size: 22px; } .gain span { color: var(--muted); font-size: 13px; }
figure.plot { margin: 20px 0; padding: 12px; border: 1px solid var(--line); border-radius: 8px; }
figure.plot figcaption { color: var(--muted); font-size: 13px; margin-top: 6px; }
figure.plot h3 { margin: 0 0 8px; font-size: 16px; }
.not-measured { color: var(--warn); font-style: italic; margin: 8px 0; }
svg.chart { max-width: 100%; height: auto; font-size: 11px; }
svg .axis { stroke: #777; } svg .grid { stroke: #eceff4; } svg .tick { fill: var(--muted); }
svg .axis-label, svg .row-label { fill: var(--fg); font-size: 12px; }
svg .ref { stroke: #999; stroke-dasharray: 4 3; }
svg .whisker { stroke: var(--accent); stroke-width: 2; }
svg .dot { fill: var(--accent); } svg .incumbent .dot { fill: #fff; stroke: var(--accent); }
svg .roof-point.kernel { fill: var(--accent); }
svg .roof-point.peer { fill: #fff; stroke: #555; stroke-width: 1.5; }
svg .ceiling { stroke: #111; stroke-width: 2; }
svg .note-in-chart { fill: var(--muted); font-size: 12px; }
svg .bar { fill: #8fb0ea; } svg .band { fill: #e8f0fd; }
svg .threshold { stroke: var(--warn); stroke-dasharray: 5 4; }
svg .clock-line { stroke: var(--accent); stroke-width: 1.5; }
svg .temperature-line { stroke: #d9480f; stroke-width: 1.5; } svg .event { fill: var(--warn); }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f6fa; }
pre { background: #f4f6fa; padding: 10px; overflow-x: auto; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 13px; }
"""

# Counts the plots on the page and flags the document as rendered (a test reads both).
_SCRIPT = """
(function () {
  var figures = document.querySelectorAll("figure.plot");
  var drawn = document.querySelectorAll("figure.plot svg.chart").length;
  document.body.setAttribute("data-plots", String(figures.length));
  document.body.setAttribute("data-plots-drawn", String(drawn));
  document.body.setAttribute("data-ready", "1");
})();
"""


def render_html(doc: dict) -> str:
    """The HTML page of a report (any readable schema version); raises InvalidReport."""
    current = checked(doc)
    markdown = render_markdown(doc)
    body = markdown.split("\n", 1)[1]  # the title is rebuilt below
    plots = "\n".join(_figure(p) for p in all_plots(current))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>autotune report {escape(current['created'])}</title>"
        f"<style>{_CSS}</style></head>\n"
        f'<body data-schema-version="{escape(current["schema_version"])}">\n'
        "<h1>autotune report</h1>\n"
        f"{_headline(current)}\n"
        f'<section id="plots"><h2>Plots</h2>\n{plots}\n</section>\n'
        f'<section id="details">{markdown_to_html(body)}</section>\n'
        f"<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def _figure(plot: Plot) -> str:
    inner = (
        plot.svg
        if plot.svg
        else f'<p class="not-measured">Not measured: {escape(plot.missing or "")}.</p>'
    )
    state = "drawn" if plot.svg else "missing"
    return (
        f'<figure class="plot {state}" id="{plot.id}"><h3>{escape(plot.title)}</h3>'
        f"{inner}<figcaption>{escape(plot.caption)}</figcaption></figure>"
    )


def _headline(doc: dict) -> str:
    gains = doc.get("gains") or {}
    e2e = gains.get("end_to_end") or {}
    cards = [
        ("end to end", e2e.get("combined")),
        ("kernel", gains.get("kernel")),
        ("hardware", gains.get("hardware")),
    ]
    html = []
    for name, g in cards:
        value = (
            f"{g['ratio']:.3f}x<span> [{g['ci_low']:.3f}, {g['ci_high']:.3f}]</span>"
            if g
            else "not measured"
        )
        html.append(
            f'<div class="gain" data-gain="{name}"><span>{name} gain</span><b>{value}</b></div>'
        )
    gpus = doc["fingerprint"]["gpus"]
    where = ", ".join(g["name"] for g in gpus) if gpus else "no GPU (CPU run)"
    sub = f'<p class="sub">Created {escape(doc["created"])} on {escape(where)}.</p>'
    return sub + '<div class="headline">' + "".join(html) + "</div>"


def markdown_to_html(md: str) -> str:
    """HTML for the Markdown subset `render_md` writes."""
    out: list[str] = []
    lines = md.split("\n")  # not splitlines(): that also breaks at \x1c, \u2028 and others
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(`{3,})(\w*)$", line)
        if fence:
            end = i + 1
            while end < len(lines) and lines[end] != fence.group(1):
                end += 1
            out.append("<pre><code>" + escape("\n".join(lines[i + 1 : end])) + "</code></pre>")
            i = end + 1
        elif heading := re.match(r"^(#{1,6}) (.*)$", line):
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
        elif line.startswith("|"):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            out.append(_table(lines[i:end]))
            i = end
        elif line.startswith("- "):
            end = i
            while end < len(lines) and lines[end].startswith("- "):
                end += 1
            items = "".join(f"<li>{_inline(x[2:])}</li>" for x in lines[i:end])
            out.append(f"<ul>{items}</ul>")
            i = end
        elif line.strip():
            end = i
            while end < len(lines) and lines[end].strip() and not _block_start(lines[end]):
                end += 1
            out.append(f"<p>{_inline(' '.join(lines[i:end]))}</p>")
            i = end
        else:
            i += 1
    return "\n".join(out)


def _block_start(line: str) -> bool:
    return line.startswith(("|", "#", "- ", "```"))


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [p.strip() for p in parts]


def _table(rows: list[str]) -> str:
    header, *body = rows
    body = [r for r in body if not re.fullmatch(r"\|(-+\|)+", r.strip())]
    head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(header))
    trs = "".join(
        "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(r)) + "</tr>" for r in body
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>"


def _inline(text: str) -> str:
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(
        f"<code>{escape(_plain(p[1:-1]))}</code>"
        if p.startswith("`") and p.endswith("`") and len(p) > 1
        else escape(_plain(p))
        for p in parts
    )


def _plain(md: str) -> str:
    """The text that `render_md` escaped into `md`: backslash escapes and entities undone
    (also in code spans, where `render_md` escapes report strings too)."""
    return unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", md))

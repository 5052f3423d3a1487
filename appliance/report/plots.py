"""The report's five plots as inline SVG, each from a current-version report document.

Every plot function returns a `Plot`: its stable id, a title, and either the SVG or the reason it
could not be drawn (shown on the page as "not measured", never silently left out).
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.report.svg import (
    MARGIN_BOTTOM,
    MARGIN_LEFT,
    MARGIN_RIGHT,
    MARGIN_TOP,
    WIDTH,
    Scale,
    esc,
    fmt,
    log_padded,
    padded,
    polyline,
    svg_open,
    x_axis,
    y_axis,
)

ROW_H = 26


@dataclass(frozen=True)
class Plot:
    id: str
    title: str
    caption: str
    svg: str | None = None
    missing: str | None = None  # why there is no SVG


def all_plots(doc: dict) -> list[Plot]:
    """The plots in page order; ids are stable (tests and links use them)."""
    return [
        speedup_plot(doc),
        roofline_plot(doc),
        noise_plot(doc),
        telemetry_plot(doc),
        virtualization_plot(doc),
    ]


# --- per-shape speedup with interval whiskers ------------------------------------------


def _speedups(doc: dict) -> list[tuple[str, dict, str]]:
    """(label, ratio_ci, kind) per task and shape: the winning candidate's speedup, else the
    incumbent's (a shape a peer won shows how far the candidate is from it)."""
    rows = []
    for task in doc["tasks"]:
        for shape in task["shapes"]:
            winner = shape["winner"]
            label = f"{task['task']} {shape['name']}"
            won = winner and winner["candidate"] not in shape["peers"]
            if won and winner["speedup_vs_best_peer"]:
                rows.append((label, winner["speedup_vs_best_peer"], "winner"))
            elif shape.get("incumbent_speedup_vs_best_peer"):
                rows.append((label, shape["incumbent_speedup_vs_best_peer"], "incumbent"))
    return rows


def speedup_plot(doc: dict) -> Plot:
    title = "Speedup over the best peer, per shape"
    caption = (
        "Dot: best peer time / candidate time (right of 1 is faster); whiskers: the 95 % interval."
    )
    rows = _speedups(doc)
    if not rows:
        return Plot("plot-speedup", title, caption, missing="no per-shape speedup was measured")
    lo = min(min(r["ci_low"] for _, r, _ in rows), 1.0)
    hi = max(max(r["ci_high"] for _, r, _ in rows), 1.0)
    height = MARGIN_TOP + ROW_H * len(rows) + MARGIN_BOTTOM
    bottom = height - MARGIN_BOTTOM
    # Room for the longest "task shape" label (about 7 px a character at the chart's font size).
    left = max(MARGIN_LEFT, 16 + 7 * max(len(label) for label, _, _ in rows))
    x = Scale(*padded(lo, hi), left, WIDTH - MARGIN_RIGHT)
    parts = [svg_open(WIDTH, height, title, "chart speedup-chart")]
    parts.append(x_axis(x, bottom, "speedup (x)", MARGIN_TOP))
    one = x(1.0)
    parts.append(
        f'<line class="ref" x1="{one:.1f}" x2="{one:.1f}" y1="{MARGIN_TOP}" y2="{bottom}"/>'
    )
    for i, (label, r, kind) in enumerate(rows):
        y = MARGIN_TOP + ROW_H * i + ROW_H / 2
        tip = f"{label}: {r['ratio']:.3f}x [{r['ci_low']:.3f}, {r['ci_high']:.3f}] ({kind})"
        parts.append(
            f'<g class="speedup-point {kind}" data-shape="{esc(label)}" data-ratio="{r["ratio"]}">'
            f"<title>{esc(tip)}</title>"
            f'<text class="row-label" x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">'
            f"{esc(label)}</text>"
            f'<line class="whisker" x1="{x(r["ci_low"]):.1f}" x2="{x(r["ci_high"]):.1f}" '
            f'y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<line class="whisker" x1="{x(r["ci_low"]):.1f}" x2="{x(r["ci_low"]):.1f}" '
            f'y1="{y - 5:.1f}" y2="{y + 5:.1f}"/>'
            f'<line class="whisker" x1="{x(r["ci_high"]):.1f}" x2="{x(r["ci_high"]):.1f}" '
            f'y1="{y - 5:.1f}" y2="{y + 5:.1f}"/>'
            f'<circle class="dot" cx="{x(r["ratio"]):.1f}" cy="{y:.1f}" r="4.5"/></g>'
        )
    parts.append("</svg>")
    return Plot("plot-speedup", title, caption, "".join(parts))


# --- roofline ---------------------------------------------------------------------------


def _roofline_points(doc: dict) -> list[tuple[str, str, float, float]]:
    """(label, kind, FLOP per byte, achieved FLOP/s) for the tuned kernel and the best peer."""
    points = []
    for task in doc["tasks"]:
        for shape in task["shapes"]:
            if shape["bytes"] <= 0 or shape["flops"] <= 0:
                continue
            intensity = shape["flops"] / shape["bytes"]
            label = f"{task['task']} {shape['name']}"
            winner = shape["winner"]
            won = winner is not None and winner["candidate"] not in shape["peers"]
            mine = winner["timing"] if won else shape["incumbent"]
            if mine and mine["median_s"] > 0:
                points.append((label, "kernel", intensity, shape["flops"] / mine["median_s"]))
            if shape["peers"]:
                peer = min(shape["peers"].values(), key=lambda t: t["median_s"])
                if peer["median_s"] > 0:
                    points.append((label, "peer", intensity, shape["flops"] / peer["median_s"]))
    return points


def roofline_plot(doc: dict) -> Plot:
    title = "Roofline: achieved FLOP rate against the measured ceilings"
    caption = (
        "x: FLOPs per byte moved; y: FLOP/s achieved (log scales). Filled: the tuned kernel; "
        "open: the best peer. Lines: bandwidth x intensity and peak FLOP/s, where measured."
    )
    points = _roofline_points(doc)
    if not points:
        return Plot("plot-roofline", title, caption, missing="no shape has bytes, FLOPs and a time")
    ceilings = next((t["ceilings"] for t in doc["tasks"] if t.get("ceilings")), None)
    bw = (ceilings or {}).get("bytes_per_s")
    peak = (ceilings or {}).get("flops_per_s")
    xs = [p[2] for p in points]
    ys = [p[3] for p in points]
    x_lo, x_hi = log_padded(min(xs), max(xs))
    if peak and bw:
        x_hi = max(x_hi, peak / bw * 2)
    roof = [v for v in (peak, bw * x_hi if bw else None) if v]
    y_lo, y_hi = log_padded(min(ys), max([*ys, min(roof)] if roof else ys))
    height = 340
    bottom = height - MARGIN_BOTTOM
    left = 90
    x = Scale(x_lo, x_hi, left, WIDTH - MARGIN_RIGHT, log=True)
    y = Scale(y_lo, y_hi, bottom, MARGIN_TOP, log=True)
    parts = [svg_open(WIDTH, height, title, "chart roofline-chart")]
    parts.append(x_axis(x, bottom, "FLOP per byte", MARGIN_TOP))
    parts.append(y_axis(y, left, "FLOP/s", WIDTH - MARGIN_RIGHT))
    parts.append(f'<clipPath id="roof-clip"><rect x="{left}" y="{MARGIN_TOP}" ')
    parts.append(
        f'width="{WIDTH - MARGIN_RIGHT - left}" height="{bottom - MARGIN_TOP}"/></clipPath>'
    )
    if bw or peak:
        steps = [x_lo * (x_hi / x_lo) ** (i / 60) for i in range(61)]
        ceiling = [min(v for v in (peak, bw * s if bw else None) if v) for s in steps]
        line = [(x(s), y(c)) for s, c in zip(steps, ceiling, strict=True)]
        parts.append(f'<g clip-path="url(#roof-clip)">{polyline(line, "ceiling")}</g>')
        text = ", ".join(t for t in (bw and f"{fmt(bw)}B/s", peak and f"{fmt(peak)}FLOP/s") if t)
        parts.append(f'<text class="note-in-chart" x="{left + 8}" y="{MARGIN_TOP + 14}">')
        parts.append(f"ceilings: {esc(text)}</text>")
    else:
        parts.append(f'<text class="note-in-chart" x="{left + 8}" y="{MARGIN_TOP + 14}">')
        parts.append("ceilings: not measured</text>")
    for label, kind, xi, yi in points:
        tip = f"{label} ({kind}): {fmt(yi)}FLOP/s at {xi:.3g} FLOP/B"
        fraction = ""
        if bw:
            fraction = f' data-fraction-of-roof="{yi / min(v for v in (peak, bw * xi) if v):.4f}"'
        parts.append(
            f'<circle class="roof-point {kind}" cx="{x(xi):.1f}" cy="{y(yi):.1f}" r="4.5" '
            f'data-shape="{esc(label)}"{fraction}><title>{esc(tip)}</title></circle>'
        )
    parts.append("</svg>")
    return Plot("plot-roofline", title, caption, "".join(parts))


# --- A/A noise distribution -------------------------------------------------------------


def noise_plot(doc: dict) -> Plot:
    title = "A/A noise: the incumbent against itself"
    caption = (
        "Histogram of A/A ratios; shaded: the A/A interval; dashed: the keep threshold "
        "1 + max(min effect, noise floor) and its inverse."
    )
    noise = doc["noise"]
    samples = (noise or {}).get("samples") or []
    if not samples:
        why = "no A/A calibration was run" if noise is None else "no A/A samples were recorded"
        return Plot("plot-noise", title, caption, missing=why)
    threshold = 1 + max(noise["min_effect"], noise["noise_floor"])
    lo_ci, hi_ci = noise["aa_ratio_ci"]
    lo, hi = padded(min(*samples, lo_ci, 1 / threshold), max(*samples, hi_ci, threshold), 0.04)
    bins = 24
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in samples:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    height = 300
    bottom = height - MARGIN_BOTTOM
    left = 70
    x = Scale(lo, hi, left, WIDTH - MARGIN_RIGHT)
    y = Scale(0, max(counts) * 1.1, bottom, MARGIN_TOP)
    parts = [svg_open(WIDTH, height, title, "chart noise-chart")]
    parts.append(
        f'<rect class="band" x="{x(lo_ci):.1f}" y="{MARGIN_TOP}" '
        f'width="{max(x(hi_ci) - x(lo_ci), 1):.1f}" height="{bottom - MARGIN_TOP}"/>'
    )
    parts.append(x_axis(x, bottom, "A/A time ratio", MARGIN_TOP))
    parts.append(y_axis(y, left, "count", WIDTH - MARGIN_RIGHT))
    for i, n in enumerate(counts):
        if n:
            x0, x1 = x(lo + i * width), x(lo + (i + 1) * width)
            parts.append(
                f'<rect class="bar" x="{x0 + 0.5:.1f}" y="{y(n):.1f}" width="{x1 - x0 - 1:.1f}" '
                f'height="{bottom - y(n):.1f}"><title>{n} samples</title></rect>'
            )
    for v in (threshold, 1 / threshold):
        parts.append(
            f'<line class="threshold" x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{MARGIN_TOP}" y2="{bottom}"/>'
        )
    parts.append("</svg>")
    return Plot("plot-noise", title, caption, "".join(parts))


# --- clocks and temperature over the run ------------------------------------------------


def telemetry_plot(doc: dict) -> Plot:
    title = "GPU clocks and temperature over the run"
    caption = "Top: SM clock (MHz), red marks where a clock event reason was seen; bottom: temperature (°C)."
    series = doc.get("telemetry") or {}
    samples = series.get("samples") or []
    panels = [
        ("sm_clock_mhz", "SM clock MHz", "clock-line"),
        ("temperature_c", "temperature °C", "temperature-line"),
    ]
    drawn = [(k, label, cls) for k, label, cls in panels if _has(samples, k)]
    if not drawn:
        return Plot("plot-telemetry", title, caption, missing="no GPU telemetry over the run")
    t_lo = min(s["t_s"] for s in samples)
    t_hi = max(s["t_s"] for s in samples)
    panel_h = 150
    height = MARGIN_TOP + panel_h * len(drawn) + MARGIN_BOTTOM
    left = 90
    x = Scale(*padded(t_lo, t_hi, 0.02), left, WIDTH - MARGIN_RIGHT)
    parts = [svg_open(WIDTH, height, title, "chart telemetry-chart")]
    for i, (key, label, cls) in enumerate(drawn):
        top = MARGIN_TOP + panel_h * i
        bottom = top + panel_h - 24
        values = [(s["t_s"], s[key]) for s in samples if s.get(key) is not None]
        lo, hi = padded(min(v for _, v in values), max(v for _, v in values), 0.1)
        y = Scale(lo, hi, bottom, top + 6)
        parts.append(f'<g class="panel" data-series="{key}">')
        parts.append(y_axis(y, left, label, WIDTH - MARGIN_RIGHT))
        parts.append(polyline([(x(t), y(v)) for t, v in values], cls))
        if key == "sm_clock_mhz":
            for s in samples:
                if s.get("reasons") and s.get(key) is not None:
                    parts.append(
                        f'<circle class="event" cx="{x(s["t_s"]):.1f}" cy="{y(s[key]):.1f}" r="3.5">'
                        f"<title>{esc(', '.join(s['reasons']))} at {s['t_s']:.4g} s</title></circle>"
                    )
        parts.append("</g>")
    parts.append(x_axis(x, height - MARGIN_BOTTOM, "seconds since start", height - MARGIN_BOTTOM))
    parts.append("</svg>")
    return Plot("plot-telemetry", title, caption, "".join(parts))


def _has(samples: list[dict], key: str) -> bool:
    return any(s.get(key) is not None for s in samples)


# --- virtualized versus bare ------------------------------------------------------------


def virtualization_plot(doc: dict) -> Plot:
    title = "Virtualized versus bare metal: host microbenchmarks"
    caption = "How many times better side A is than side B per metric (right of 1: A better), with the 95 % interval."
    comparison = doc["baselines"].get("comparison")
    if not comparison or not comparison["metrics"]:
        return Plot(
            "plot-virt", title, caption, missing="no baseline comparison of two environments"
        )
    metrics = comparison["metrics"]
    a, b = comparison["label_a"], comparison["label_b"]
    lo = min(min(m["ci_low"] for m in metrics), 1.0)
    hi = max(max(m["ci_high"] for m in metrics), 1.0)
    height = MARGIN_TOP + ROW_H * len(metrics) + MARGIN_BOTTOM
    bottom = height - MARGIN_BOTTOM
    x = Scale(*padded(lo, hi), MARGIN_LEFT, WIDTH - MARGIN_RIGHT)
    parts = [svg_open(WIDTH, height, title, "chart virt-chart")]
    parts.append(x_axis(x, bottom, f"{a} better than {b} by (x)", MARGIN_TOP))
    parts.append(
        f'<line class="ref" x1="{x(1.0):.1f}" x2="{x(1.0):.1f}" y1="{MARGIN_TOP}" y2="{bottom}"/>'
    )
    for i, m in enumerate(metrics):
        yy = MARGIN_TOP + ROW_H * i + ROW_H / 2
        name = m.get("title") or m["name"]
        tip = f"{name}: {m['ratio']:.3f}x [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
        parts.append(
            f'<g class="virt-point" data-metric="{esc(m["name"])}"><title>{esc(tip)}</title>'
            f'<text class="row-label" x="{MARGIN_LEFT - 8}" y="{yy + 4:.1f}" text-anchor="end">'
            f"{esc(name)}</text>"
            f'<line class="whisker" x1="{x(m["ci_low"]):.1f}" x2="{x(m["ci_high"]):.1f}" '
            f'y1="{yy:.1f}" y2="{yy:.1f}"/>'
            f'<circle class="dot" cx="{x(m["ratio"]):.1f}" cy="{yy:.1f}" r="4.5"/></g>'
        )
    parts.append("</svg>")
    return Plot("plot-virt", title, caption, "".join(parts))

"""Small SVG chart primitives written by hand: scales, ticks, axes, escaping. No plotting library,
so the HTML report stays one self-contained file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH = 720
MARGIN_LEFT = 150
MARGIN_RIGHT = 30
MARGIN_TOP = 20
MARGIN_BOTTOM = 46


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def fmt(value: float) -> str:
    """A short tick or label number: 1.05, 2.5k, 3e+12 stays readable."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.4g}"


@dataclass(frozen=True)
class Scale:
    """Maps a data interval onto a pixel interval, linearly or on a log10 axis."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log: bool = False

    def __call__(self, value: float) -> float:
        lo, hi, v = self.lo, self.hi, value
        if self.log:
            lo, hi, v = math.log10(lo), math.log10(hi), math.log10(max(value, 1e-300))
        span = hi - lo or 1.0
        return self.px_lo + (v - lo) / span * (self.px_hi - self.px_lo)

    def ticks(self, count: int = 6) -> list[float]:
        if self.log:
            return log_ticks(self.lo, self.hi, count)
        return linear_ticks(self.lo, self.hi, count)


def log_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Powers of ten inside [lo, hi]; 1-2-5 steps when fewer than two decades fit."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [10.0**e for e in range(first, last + 1) if lo <= 10.0**e <= hi]
    if len(decades) >= 2:
        step = max(1, math.ceil(len(decades) / count))
        return decades[::step]
    return [
        m * 10.0**e for e in range(first, last + 1) for m in (1, 2, 5) if lo <= m * 10.0**e <= hi
    ]


def linear_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round-numbered ticks inside [lo, hi]."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.ceil(lo / step) * step
    ticks = []
    value = start
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def padded(lo: float, hi: float, fraction: float = 0.06) -> tuple[float, float]:
    """[lo, hi] widened a little on both sides (and made non-empty)."""
    if hi <= lo:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * fraction
    return lo - pad, hi + pad


def log_padded(lo: float, hi: float) -> tuple[float, float]:
    """A log-axis interval around [lo, hi] (both > 0), a little wider."""
    return lo / 1.6, hi * 1.6


def svg_open(width: int, height: int, label: str, cls: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{esc(cls)}" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-label="{esc(label)}"><title>{esc(label)}</title>'
    )


def x_axis(scale: Scale, y: float, label: str, top: float) -> str:
    """Bottom axis at pixel row `y` with grid lines up to `top`, tick labels and a title."""
    parts = [
        f'<line class="axis" x1="{scale.px_lo:.1f}" x2="{scale.px_hi:.1f}" y1="{y}" y2="{y}"/>'
    ]
    for tick in scale.ticks():
        x = scale(tick)
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{y}"/>')
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{y + 14}" text-anchor="middle">{fmt(tick)}</text>'
        )
    mid = (scale.px_lo + scale.px_hi) / 2
    parts.append(
        f'<text class="axis-label" x="{mid:.1f}" y="{y + 34}" text-anchor="middle">{esc(label)}</text>'
    )
    return "".join(parts)


def y_axis(scale: Scale, x: float, label: str, right: float) -> str:
    """Left axis at pixel column `x` with grid lines to `right`, tick labels and a title."""
    parts = [
        f'<line class="axis" x1="{x}" x2="{x}" y1="{scale.px_lo:.1f}" y2="{scale.px_hi:.1f}"/>'
    ]
    for tick in scale.ticks(5):
        y = scale(tick)
        parts.append(f'<line class="grid" x1="{x}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="tick" x="{x - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(tick)}</text>'
        )
    mid = (scale.px_lo + scale.px_hi) / 2
    parts.append(
        f'<text class="axis-label" transform="translate({x - 58},{mid:.1f}) rotate(-90)" '
        f'text-anchor="middle">{esc(label)}</text>'
    )
    return "".join(parts)


def polyline(points: list[tuple[float, float]], cls: str) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline class="{esc(cls)}" fill="none" points="{coords}"/>'

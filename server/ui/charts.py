"""Charts drawn by the server as SVG (no script, no CDN): each is paired in the templates with
a table holding the same figures, for screen readers and for copying numbers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import NamedTuple

from markupsafe import Markup, escape
from pydantic import BaseModel

LABEL_WIDTH = 230
PLOT_WIDTH = 420
ROW_HEIGHT = 26
# Colour-blind-safe (Okabe-Ito) series colours.
SERIES_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")


class Bar(BaseModel):
    label: str
    value: float
    ci95: float | None = None
    key: str = ""  # what the bar stands for, exposed as data-key for tests and tooling


class StackedBar(BaseModel):
    label: str
    parts: list[float]


class Point(NamedTuple):  # one per prompt pair: a tuple, not a validated model
    x: float
    y: float
    series: str


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return value


def _svg(width: float, height: float, title: str, body: list[str]) -> Markup:
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def _axis(top: float, bottom: float, scale_max: float, unit: str) -> list[str]:
    parts = []
    for tick in range(5):
        value = scale_max * tick / 4
        x = LABEL_WIDTH + PLOT_WIDTH * tick / 4
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#ddd"/>'
            f'<text x="{x:.1f}" y="{bottom + 14}" font-size="11" text-anchor="middle" '
            f'fill="#333">{value:,.4g}</text>'
        )
    parts.append(
        f'<text x="{LABEL_WIDTH + PLOT_WIDTH / 2}" y="{bottom + 30}" font-size="12" '
        f'text-anchor="middle" fill="#333">{escape(unit)}</text>'
    )
    return parts


def bar_chart(bars: Sequence[Bar], title: str, unit: str) -> Markup:
    """Horizontal bars with 95% confidence whiskers; one row per bar."""
    height = ROW_HEIGHT * len(bars) + 50
    scale_max = _nice_max(max((bar.value + (bar.ci95 or 0) for bar in bars), default=1))
    body = _axis(4, height - 40, scale_max, unit)
    for index, bar in enumerate(bars):
        y = 6 + index * ROW_HEIGHT
        width = PLOT_WIDTH * bar.value / scale_max
        body.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" font-size="12" text-anchor="end" '
            f'fill="#1d1d1f">{escape(bar.label)}</text>'
            f'<rect class="bar" data-key="{escape(bar.key)}" x="{LABEL_WIDTH}" y="{y + 3}" '
            f'width="{width:.1f}" height="{ROW_HEIGHT - 8}" fill="{SERIES_COLOURS[0]}">'
            f"<title>{escape(bar.label)}: {bar.value:,.1f} {escape(unit)}"
            f"{f' ± {bar.ci95:,.1f}' if bar.ci95 is not None else ''}</title></rect>"
        )
        if bar.ci95:
            low = LABEL_WIDTH + PLOT_WIDTH * max(0.0, bar.value - bar.ci95) / scale_max
            high = LABEL_WIDTH + PLOT_WIDTH * (bar.value + bar.ci95) / scale_max
            middle = y + ROW_HEIGHT / 2
            body.append(
                f'<path class="whisker" d="M{low:.1f},{middle:.1f}H{high:.1f}'
                f"M{low:.1f},{middle - 5:.1f}V{middle + 5:.1f}"
                f'M{high:.1f},{middle - 5:.1f}V{middle + 5:.1f}" stroke="#1d1d1f" '
                f'stroke-width="1.5" fill="none"/>'
            )
    return _svg(LABEL_WIDTH + PLOT_WIDTH + 20, height, title, body)


def stacked_bar_chart(
    bars: Sequence[StackedBar], series: Sequence[str], title: str, unit: str
) -> Markup:
    """Horizontal bars split into series (same order for every bar), with a legend."""
    legend_height = 22
    height = ROW_HEIGHT * len(bars) + 50 + legend_height
    scale_max = _nice_max(max((sum(bar.parts) for bar in bars), default=1))
    body = []
    for index, name in enumerate(series):
        x = LABEL_WIDTH + index * 105
        body.append(
            f'<rect x="{x}" y="4" width="12" height="12" fill="{SERIES_COLOURS[index]}"/>'
            f'<text x="{x + 16}" y="14" font-size="11" fill="#1d1d1f">{escape(name)}</text>'
        )
    body += _axis(legend_height + 4, height - 40, scale_max, unit)
    for index, bar in enumerate(bars):
        y = legend_height + 6 + index * ROW_HEIGHT
        body.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" font-size="12" text-anchor="end" '
            f'fill="#1d1d1f">{escape(bar.label)}</text>'
        )
        left = float(LABEL_WIDTH)
        for part_index, value in enumerate(bar.parts):
            width = PLOT_WIDTH * value / scale_max
            body.append(
                f'<rect class="segment" x="{left:.1f}" y="{y + 3}" width="{width:.1f}" '
                f'height="{ROW_HEIGHT - 8}" fill="{SERIES_COLOURS[part_index]}">'
                f"<title>{escape(bar.label)} · {escape(series[part_index])}: "
                f"{value:,.2f} {escape(unit)}</title></rect>"
            )
            left += width
    return _svg(LABEL_WIDTH + PLOT_WIDTH + 20, height, title, body)


def scatter_chart(points: Sequence[Point], title: str, x_label: str, y_label: str) -> Markup:
    """Variant (y) against baseline (x) per prompt; points above the diagonal are faster."""
    size, margin = 360, 50
    scale_max = _nice_max(max((max(point.x, point.y) for point in points), default=1))
    names = sorted({point.series for point in points})

    def at(value: float) -> float:
        return size * value / scale_max

    body = [
        f'<rect x="{margin}" y="10" width="{size}" height="{size}" fill="none" stroke="#bbb"/>',
        f'<line class="diagonal" x1="{margin}" y1="{10 + size}" x2="{margin + size}" y2="10" '
        f'stroke="#888" stroke-dasharray="4 3"/>',
        f'<text x="{margin + size / 2}" y="{size + 44}" font-size="12" text-anchor="middle" '
        f'fill="#333">{escape(x_label)}</text>',
        f'<text x="14" y="{10 + size / 2}" font-size="12" text-anchor="middle" fill="#333" '
        f'transform="rotate(-90 14 {10 + size / 2})">{escape(y_label)}</text>',
    ]
    for tick in range(5):
        value = scale_max * tick / 4
        body.append(
            f'<text x="{margin + at(value):.1f}" y="{size + 26}" font-size="11" '
            f'text-anchor="middle" fill="#333">{value:,.4g}</text>'
            f'<text x="{margin - 4}" y="{10 + size - at(value) + 4:.1f}" font-size="11" '
            f'text-anchor="end" fill="#333">{value:,.4g}</text>'
        )
    for index, name in enumerate(names):
        body.append(
            f'<rect x="{margin + size + 12}" y="{14 + 18 * index}" width="10" height="10" '
            f'fill="{SERIES_COLOURS[index % len(SERIES_COLOURS)]}"/>'
            f'<text x="{margin + size + 26}" y="{23 + 18 * index}" font-size="11" '
            f'fill="#1d1d1f">{escape(name)}</text>'
        )
    colour = {name: SERIES_COLOURS[i % len(SERIES_COLOURS)] for i, name in enumerate(names)}
    for point in points:
        body.append(
            f'<circle class="point" cx="{margin + at(point.x):.1f}" '
            f'cy="{10 + size - at(point.y):.1f}" r="3.5" fill="{colour[point.series]}" '
            f'fill-opacity="0.75"/>'
        )
    return _svg(margin + size + 230, size + 60, title, body)


class NightPoint(BaseModel):
    at: datetime
    mean: float
    half_width: float
    label: str  # the night, as its table row names it


class ChangeMarker(BaseModel):
    """An alert on the series: drawn at its first bad night, linked to the alert (and to the
    graph diff of the two nights' builds when they differ)."""

    at: datetime
    kind: str  # regression / improvement / suspected
    text: str
    href: str
    diff_href: str | None = None


TREND_MARGIN_LEFT, TREND_PLOT, TREND_HEIGHT = 64, 560, 200
MARKER_COLOURS = {"regression": "#D55E00", "improvement": "#009E73", "suspected": "#666666"}


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    """Round tick values spanning [low, high]."""
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(s * magnitude for s in (1, 2, 2.5, 5, 10) if s * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(count + 1) if first + i * step <= high + step * 1e-9]


def _trend_markers(
    markers: Sequence[ChangeMarker], x: Callable[[datetime], float], top: int, bottom: int
) -> list[str]:
    """The alerts' dashed lines and flag links on a trend chart, with their build-diff links."""
    body: list[str] = []
    for marker in markers:
        at, colour = x(marker.at), MARKER_COLOURS.get(marker.kind, "#666666")
        hollow = marker.kind == "suspected"
        body.append(
            f'<line x1="{at:.1f}" y1="{top}" x2="{at:.1f}" y2="{bottom}" stroke="{colour}" '
            f'stroke-dasharray="4 3"/><a class="marker marker-{escape(marker.kind)}" '
            f'href="{escape(marker.href)}" aria-label="{escape(marker.text)}">'
            f'<path d="M{at - 7:.1f},{top - 16}h14l-7,12z" fill="{"white" if hollow else colour}" '
            f'stroke="{colour}" stroke-width="1.5"/><title>{escape(marker.text)}</title></a>'
        )
        if marker.diff_href:
            # Beside the marker, on the side with room (the newest night is at the right edge).
            left = at > TREND_MARGIN_LEFT + TREND_PLOT / 2
            body.append(
                f'<a class="marker-diff" href="{escape(marker.diff_href)}" '
                f'aria-label="Build diff for: {escape(marker.text)}"><text '
                f'x="{at - 10 if left else at + 10:.1f}" y="{top - 6}" font-size="11" '
                f'text-anchor="{"end" if left else "start"}" fill="#0058b0" '
                f'text-decoration="underline">build diff</text></a>'
            )
    return body


def trend_chart(
    points: Sequence[NightPoint], markers: Sequence[ChangeMarker], title: str
) -> Markup:
    """Nightly mean tok/s as a line over its 95% interval band, time across; alerts are marked
    at their first bad night. Not ``role="img"``: its markers are links."""
    top, bottom = 26, 26 + TREND_HEIGHT
    lows = [p.mean - p.half_width for p in points] or [0.0]
    highs = [p.mean + p.half_width for p in points] or [1.0]
    low, high = min(lows), max(highs)
    pad = (high - low) * 0.1 or max(abs(high) * 0.05, 1.0)
    low, high = max(0.0, low - pad), high + pad
    times = [p.at.timestamp() for p in points] + [m.at.timestamp() for m in markers]
    first, last = min(times, default=0.0), max(times, default=0.0)

    def x(at: datetime) -> float:
        if last == first:
            return TREND_MARGIN_LEFT + TREND_PLOT / 2
        return TREND_MARGIN_LEFT + TREND_PLOT * (at.timestamp() - first) / (last - first)

    def y(value: float) -> float:
        return bottom - TREND_HEIGHT * (value - low) / (high - low)

    right = TREND_MARGIN_LEFT + TREND_PLOT
    body = [f'<rect x="{TREND_MARGIN_LEFT}" y="{top}" width="{TREND_PLOT}" '
            f'height="{TREND_HEIGHT}" fill="none" stroke="#bbb"/>']  # fmt: skip
    for tick in _ticks(low, high):
        body.append(
            f'<line x1="{TREND_MARGIN_LEFT}" y1="{y(tick):.1f}" x2="{right}" y2="{y(tick):.1f}" '
            f'stroke="#e4e4e4"/><text x="{TREND_MARGIN_LEFT - 6}" y="{y(tick) + 4:.1f}" '
            f'font-size="11" text-anchor="end" fill="#333">{tick:,.4g}</text>'
        )
    body.append(
        f'<text x="14" y="{(top + bottom) / 2}" font-size="12" text-anchor="middle" fill="#333" '
        f'transform="rotate(-90 14 {(top + bottom) / 2})">tok/s</text>'
    )
    step = max(1, math.ceil(len(points) / 6))
    for point in list(points)[::step]:
        body.append(
            f'<text x="{x(point.at):.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle" '
            f'fill="#333">{point.at:%m-%d}</text>'
        )
    if points:
        upper = " ".join(f"{x(p.at):.1f},{y(p.mean + p.half_width):.1f}" for p in points)
        lower = " ".join(f"{x(p.at):.1f},{y(p.mean - p.half_width):.1f}" for p in reversed(points))
        line = " ".join(f"{x(p.at):.1f},{y(p.mean):.1f}" for p in points)
        body.append(
            f'<polygon class="band" points="{upper} {lower}" fill="{SERIES_COLOURS[0]}" '
            f'fill-opacity="0.18"/><polyline class="trend" points="{line}" fill="none" '
            f'stroke="{SERIES_COLOURS[0]}" stroke-width="2"/>'
        )
    for point in points:
        body.append(
            f'<circle class="night" cx="{x(point.at):.1f}" cy="{y(point.mean):.1f}" r="3" '
            f'fill="{SERIES_COLOURS[0]}"><title>{escape(point.label)}: {point.mean:,.1f} ± '
            f"{point.half_width:,.1f} tok/s</title></circle>"
        )
    body.extend(_trend_markers(markers, x, top, bottom))
    width, height = right + 20, bottom + 26
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )

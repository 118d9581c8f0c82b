"""Charts drawn by the server as SVG (no script, no CDN): each is paired in the templates with
a table holding the same figures, for screen readers and for copying numbers."""

from __future__ import annotations

from collections.abc import Sequence

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


class Point(BaseModel):
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

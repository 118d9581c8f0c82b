"""The server's SVG charts: one mark per figure, scaled to the figures, text escaped."""

from __future__ import annotations

import re

from server.ui.charts import Bar, Point, StackedBar, bar_chart, scatter_chart, stacked_bar_chart


def test_bars_have_whiskers_spanning_their_interval() -> None:
    svg = bar_chart(
        [Bar(label="a · x", value=50, ci95=10, key="a|x"), Bar(label="<b>", value=100, key="b")],
        "tok/s",
        "tok/s",
    )
    widths = [float(w) for w in re.findall(r'class="bar"[^>]*width="([\d.]+)"', svg)]
    assert len(widths) == 2 and widths[1] == 2 * widths[0]  # drawn to scale
    assert svg.count('class="whisker"') == 1  # only the bar with an interval
    low, high = map(float, re.search(r'd="M([\d.]+),[\d.]+H([\d.]+)', svg).groups())
    assert high - low == 2 * widths[0] * 10 / 50  # ±10 around 50 at the bars' scale
    assert "&lt;b&gt;" in svg and "<b>" not in svg


def test_stacked_bars_add_up_and_scatter_has_one_point_per_pair() -> None:
    svg = stacked_bar_chart(
        [StackedBar(label="b1", parts=[3, 1, 0, 0]), StackedBar(label="b2", parts=[1, 1, 1, 1])],
        ["weights", "KV read", "KV write", "redundant"],
        "bytes",
        "MiB",
    )
    assert svg.count('class="segment"') == 8
    scatter = scatter_chart(
        [Point(x=1, y=2, series="s"), Point(x=2, y=2, series="s")], "t", "base", "variant"
    )
    assert scatter.count('class="point"') == 2 and 'class="diagonal"' in scatter

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


def test_trend_band_spans_each_nights_interval_and_markers_link_alert_and_diff() -> None:
    from datetime import UTC, datetime, timedelta

    from server.ui.charts import ChangeMarker, NightPoint, trend_chart

    first = datetime(2027, 1, 1, 2, tzinfo=UTC)
    nights = [
        NightPoint(at=first + timedelta(days=i), mean=m, half_width=h, label=f"n{i}")
        for i, (m, h) in enumerate([(100, 2), (101, 4), (92, 2)])
    ]
    marker = ChangeMarker(at=nights[2].at, kind="regression", text="<alert 1>",
                          href="#alert-1", diff_href="/builds/1/diff/2")  # fmt: skip
    svg = trend_chart(nights, [marker], "trend")
    band = [tuple(map(float, p.split(","))) for p in re.search(r'class="band" points="([^"]+)"', svg).group(1).split()]  # fmt: skip
    assert len(band) == 6  # upper edge forward, lower edge back
    line = [float(p.split(",")[1]) for p in re.search(r'class="trend" points="([^"]+)"', svg).group(1).split()]  # fmt: skip
    for index, y in enumerate(line):  # each mean sits inside its band, widest where h is
        upper, lower = band[index][1], band[5 - index][1]
        assert upper < y < lower and abs((lower - y) - (y - upper)) < 0.2
    assert (band[4][1] - band[1][1]) > 1.9 * (band[5][1] - band[0][1])
    assert line[2] > line[0]  # slower is lower on the page
    assert 'href="#alert-1"' in svg and 'href="/builds/1/diff/2"' in svg
    assert "&lt;alert 1&gt;" in svg and "<alert 1>" not in svg
    one = trend_chart(nights[:1], [], "one night")  # a single night is drawn, not divided by 0
    assert one.count('class="night"') == 1

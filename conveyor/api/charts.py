"""The dashboard's charts as inline SVG geometry, computed on the server (no script, no CDN).

:func:`charts` turns a :class:`~conveyor.history.QueueHistory` into
three :class:`Chart`\\ s — throughput, wait and run time percentiles, depth —
each a few polylines in a fixed view box; ``_charts.html`` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from conveyor.history import QueueHistory

#: The view box of every chart (the SVG scales to its column's width).
WIDTH, HEIGHT = 420, 170

#: Margins inside the view box for the axis labels.
LEFT, RIGHT, TOP, BOTTOM = 46, 12, 10, 22


@dataclass(frozen=True)
class Series:
    """One line: its name, colour, SVG points, and the latest value as text."""

    name: str
    color: str
    points: str
    last: str
    #: Where the latest value is drawn (a dot: a single point draws no line), None when there is none.
    dot: tuple[float, float] | None
    #: How many of the window's points have a value (0: nothing to draw).
    count: int


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    series: list[Series]
    #: Horizontal grid lines: (y in the view box, label).
    ticks: list[tuple[float, str]]
    #: Time labels along the bottom: (x in the view box, label, text-anchor).
    times: list[tuple[float, str, str]]
    empty: bool
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT


def _duration(seconds: float) -> str:
    if seconds <= 0:
        return "0"
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min"


def _count(n: float) -> str:
    return f"{n / 1000:.3g}k" if n >= 10000 else f"{n:.0f}"


def _x(i: int, n: int) -> float:
    span = WIDTH - LEFT - RIGHT
    return LEFT + (span * i / (n - 1) if n > 1 else span / 2)


def _nice(top: float) -> float:
    """A round upper bound at or above ``top``."""
    if top <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(top))
    return next(float(m * power) for m in (1, 2, 2.5, 5, 10) if m * power >= top)


Line = tuple[str, str, list[float | None]]


def _linear(chart_id: str, title: str, lines: list[Line], h: QueueHistory) -> Chart:
    """Counts on a linear scale from 0."""
    values = [v for _, _, vs in lines for v in vs if v is not None]
    top = max(4.0, _nice(max(values, default=0.0)))  # whole numbers on every tick
    plot = HEIGHT - TOP - BOTTOM
    label = _count

    def y(v: float) -> float:
        return TOP + plot * (1 - v / top)

    return _chart(chart_id, title, lines, h, y, [(y(top * k / 4), label(top * k / 4)) for k in range(5)], label)


def _log(chart_id: str, title: str, lines: list[Line], h: QueueHistory) -> Chart:
    """Times on a log scale: a millisecond and a minute on one chart."""
    values = [v for _, _, vs in lines for v in vs if v is not None and v > 0]
    low = 10 ** math.floor(math.log10(min(values, default=0.001)))
    high = 10 ** math.ceil(math.log10(max(values, default=1.0)))
    high = max(high, low * 10)
    plot = HEIGHT - TOP - BOTTOM
    span = math.log10(high) - math.log10(low)

    def y(v: float) -> float:
        v = max(v, low)
        return TOP + plot * (1 - (math.log10(v) - math.log10(low)) / span)

    decades = int(round(span))
    ticks = [(y(low * 10**k), _duration(low * 10**k)) for k in range(decades + 1)]
    return _chart(chart_id, title, lines, h, y, ticks, _duration)


def _chart(
    chart_id: str,
    title: str,
    lines: list[Line],
    h: QueueHistory,
    y: Callable[[float], float],
    ticks: list[tuple[float, str]],
    label: Callable[[float], str],
) -> Chart:
    n = len(h.points)
    series = []
    for name, color, vs in lines:
        pts = [(_x(i, n), y(v)) for i, v in enumerate(vs) if v is not None]
        last = next((v for v in reversed(vs) if v is not None), None)
        text = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        series.append(
            Series(name, color, text, "–" if last is None else label(last), pts[-1] if pts else None, len(pts))
        )
    fmt = "%H:%M"
    times = [
        (
            _x(i, n),
            datetime.fromtimestamp(h.points[i].at, UTC).strftime(fmt),
            "start" if i == 0 else "end" if i == n - 1 else "middle",
        )
        for i in sorted({0, n // 4, n // 2, 3 * n // 4, n - 1})
        if 0 <= i < n
    ]
    return Chart(chart_id, title, series, ticks, times, empty=not any(s.count for s in series))


def charts(h: QueueHistory) -> list[Chart]:
    """Throughput, wait/run percentiles and depth of a history, ready to draw."""
    p = h.points
    unit = "minute" if h.step == 60 else f"{h.step // 60} min"
    return [
        _linear(
            "chart-throughput",
            f"Jobs per {unit}",
            [
                ("completed", "#16a34a", [float(x.completed) for x in p]),
                ("failed for good", "#dc2626", [float(x.failed) for x in p]),
                ("retried", "#d97706", [float(x.retried) for x in p]),
                ("enqueued", "#2f5bea", [float(x.enqueued) for x in p]),
            ],
            h,
        ),
        _log(
            "chart-times",
            "Wait and run time (p50, p95)",
            [
                ("wait p50", "#8b5cf6", [x.wait_p50 for x in p]),
                ("wait p95", "#c4b5fd", [x.wait_p95 for x in p]),
                ("run p50", "#0891b2", [x.run_p50 for x in p]),
                ("run p95", "#67e8f9", [x.run_p95 for x in p]),
            ],
            h,
        ),
        _linear(
            "chart-depth",
            "Waiting jobs",
            [("waiting", "#2f5bea", [None if x.depth is None else float(x.depth) for x in p])],
            h,
        ),
    ]

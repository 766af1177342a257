"""The Charts page: throughput, failures, wait time and runtime over a chosen window, from
the rollup the daemons keep (attempt_rollups, migration 0038), drawn as server-side SVG
with axes, units and a legend (no script, the same CSP).

The window is one of WINDOWS (anything else is refused: `window_of` raises BadWindow).
Each window reads one grain of the rollup (minutes for 1 h and 6 h, hours for 24 h and
7 d), so a page reads at most (window / grain) x handlers rows, whatever the number of
jobs. Wait time and runtime are histograms; a percentile is the upper bound of the
bucket it falls in (as Prometheus's histogram_quantile without interpolation): "p95
<= 2.5 s" is what the rollup knows.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pgworkerd.durations import format_duration


@dataclass(frozen=True)
class Window:
    name: str  # as the page's parameter writes it
    seconds: int
    grain: int  # the rollup's grain read (attempt_rollups.grain_seconds)
    step: int  # seconds per point of the charts (a multiple of the grain)
    label: str
    step_label: str  # "minute": the throughput chart counts attempts per this


WINDOWS: dict[str, Window] = {
    w.name: w
    for w in (
        Window("1h", 3600, 60, 60, "1 hour", "minute"),
        Window("6h", 6 * 3600, 300, 300, "6 hours", "5 minutes"),
        Window("24h", 24 * 3600, 3600, 3600, "24 hours", "hour"),
        Window("7d", 7 * 86400, 10800, 10800, "7 days", "3 hours"),
    )
}
DEFAULT_WINDOW = "6h"
# Handlers listed per window at most: the busiest; the rest are summed in one row.
HANDLERS_SHOWN = 20
OTHER_HANDLERS = "(all other handlers)"
# The percentiles the charts and the table show.
PERCENTILES = (0.5, 0.95, 0.99)


class BadWindow(ValueError):
    """A window the page does not offer."""


def window_of(value: str | None) -> Window:
    if not value:
        return WINDOWS[DEFAULT_WINDOW]
    found = WINDOWS.get(value)
    if found is None:
        shown = value[:20] + ("…" if len(value) > 20 else "")
        raise BadWindow(
            f"unknown window {shown!r}: the charts cover one of {', '.join(WINDOWS)} "
            "(the rollup keeps minutes for a day and hours for 35 days)"
        )
    return found


def percentile(counts: Sequence[int], bounds: Sequence[float], q: float) -> float | None:
    """The q-quantile of a histogram over `bounds` (element i: values in [bounds[i-1],
    bounds[i]), element 0 below bounds[0], the last at or above bounds[-1]) as the upper
    bound of its bucket; math.inf in the last bucket; None without values."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n > 0:
            return bounds[i] if i < len(bounds) else math.inf
    return math.inf


def _added(a: list[int], b: Sequence[int]) -> list[int]:
    """Two histograms of the same bounds added (map: the cheapest loop on a page that
    adds up to (window / bucket) x handlers of them)."""
    if not a:
        return list(b)
    return list(map(operator.add, a, b))


@dataclass
class Totals:
    """Counts and histograms summed over some buckets."""

    completed: int = 0
    failed: int = 0
    run: list[int] = field(default_factory=list)
    wait: list[int] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.completed += int(row["completed"])
        self.failed += int(row["failed"])
        self.run = _added(self.run, row["run_counts"])
        self.wait = _added(self.wait, row["wait_counts"])

    def merge(self, other: Totals) -> None:
        self.completed += other.completed
        self.failed += other.failed
        self.run = _added(self.run, other.run)
        self.wait = _added(self.wait, other.wait)


@dataclass
class Summary:
    window: Window
    bounds: list[float]
    starts: list[datetime]  # each point's start, oldest first
    points: list[Totals]
    handlers: list[tuple[str, Totals]]  # busiest first, at most HANDLERS_SHOWN (+ others)
    whole: Totals


def first_start(window: Window, now: datetime) -> datetime:
    """The start of a window's first point (its last one holds `now`): what to read from."""
    step = timedelta(seconds=window.step)
    epoch = datetime(2000, 1, 1, tzinfo=UTC)  # the rollup's date_bin origin
    last = epoch + ((now.astimezone(UTC) - epoch) // step) * step
    return last - (window.seconds // window.step - 1) * step


def summarize(
    rows: Iterable[dict[str, Any]], window: Window, now: datetime, bounds: Sequence[float]
) -> Summary:
    """The rollup's rows of one window (histograms over `bounds`) as points of
    window.step seconds (the last one holds `now`) and per handler totals."""
    step = timedelta(seconds=window.step)
    count = window.seconds // window.step
    first = first_start(window, now)
    starts = [first + i * step for i in range(count)]
    points = [Totals() for _ in starts]
    per_handler: dict[str, Totals] = {}
    for row in rows:
        index = (row["bucket_start"] - first) // step
        if not 0 <= index < count:
            continue
        points[index].add(row)
        totals = per_handler.get(row["handler"])
        if totals is None:
            totals = per_handler[row["handler"]] = Totals()
        totals.add(row)
    whole = Totals()
    for point in points:
        whole.merge(point)
    busiest = sorted(per_handler.items(), key=lambda kv: (-(kv[1].completed + kv[1].failed), kv[0]))
    handlers = busiest[:HANDLERS_SHOWN]
    if len(busiest) > HANDLERS_SHOWN:
        rest = Totals()
        for _, totals in busiest[HANDLERS_SHOWN:]:
            rest.merge(totals)
        handlers.append((OTHER_HANDLERS, rest))
    return Summary(window, [float(b) for b in bounds], starts, points, handlers, whole)


# -- drawing -------------------------------------------------------------------------------

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 10, 30


@dataclass
class Series:
    name: str
    css: str  # the class that colours it (style.css)
    points: str  # an SVG polyline's points
    dots: list[tuple[float, float, str]]  # x, y, tooltip


@dataclass
class Chart:
    id: str
    title: str
    y_unit: str
    series: list[Series]
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM


def _x(i: int, count: int) -> float:
    span = WIDTH - RIGHT - LEFT
    return round(LEFT + (span * i / max(1, count - 1)), 1)


def _x_ticks(summary: Summary) -> list[tuple[float, str]]:
    count = len(summary.starts)
    shown = 6
    every = max(1, (count - 1) // shown)
    fmt = "%m-%d %H:%M" if summary.window.seconds > 86400 else "%H:%M"
    return [
        (_x(i, count), summary.starts[i].strftime(fmt))
        for i in range(0, count, every)
        if count - 1 - i >= every // 2 or i == count - 1
    ]


def _nice_top(peak: float) -> float:
    """The top of a count axis of four equal steps, each 1, 2, 2.5 or 5 x 10^k and whole:
    tick labels stay whole numbers (0, 2, 4, 6, 8 for a peak of 5)."""
    need = max(peak, 1.0) / 4
    magnitude = 10 ** math.floor(math.log10(need))
    for m in (1, 2, 2.5, 5, 10):
        if m == 2.5 and magnitude < 10:
            continue  # 2.5 is not a whole step
        if need <= m * magnitude:
            return max(1.0, m * magnitude) * 4
    return 40 * magnitude


def _count_label(value: float) -> str:
    return f"{value:g}" if value < 10000 else f"{value / 1000:g}k"


def counts_chart(summary: Summary, chart_id: str = "chart-throughput") -> Chart:
    """Ended attempts per step: completed and failed (failed, dead, lease expired)."""
    count = len(summary.points)
    top = _nice_top(max((max(p.completed, p.failed) for p in summary.points), default=0))
    plot = HEIGHT - BOTTOM - TOP
    step = summary.window.step_label

    def y(v: float) -> float:
        return round(HEIGHT - BOTTOM - plot * v / top, 1)

    series = []
    for name, css, pick in (
        ("completed", "line-ok", lambda p: p.completed),
        ("failed", "line-bad", lambda p: p.failed),
    ):
        coords = [(_x(i, count), y(pick(p))) for i, p in enumerate(summary.points)]
        dots = [
            (x, yy, f"{summary.starts[i]:%Y-%m-%d %H:%MZ}: {pick(summary.points[i])} {name}")
            for i, (x, yy) in enumerate(coords)
        ]
        series.append(Series(name, css, " ".join(f"{x},{yy}" for x, yy in coords), dots))
    ticks = [(y(top * k / 4), _count_label(top * k / 4)) for k in range(5)]
    return Chart(
        chart_id,
        f"Ended attempts per {step}",
        f"attempts per {step}",
        series,
        _x_ticks(summary),
        ticks,
    )


# The time axes are logarithmic, from LOG_LOW to LOG_HIGH seconds; values beyond the
# rollup's last bound (an hour) are drawn at the top.
LOG_LOW, LOG_HIGH = 0.001, 7200.0
TIME_TICKS = (
    (0.001, "1 ms"),
    (0.01, "10 ms"),
    (0.1, "100 ms"),
    (1.0, "1 s"),
    (10.0, "10 s"),
    (60.0, "1 min"),
    (600.0, "10 min"),
    (3600.0, "1 h"),
)


def _time_label(seconds: float) -> str:
    return format_duration(seconds) if seconds < 60 else format_duration(seconds, rounded=True)


def time_chart(summary: Summary, which: str) -> Chart:
    """Wait time (which="wait": due to claim) or runtime ("run") per step: p50 and p95."""
    count = len(summary.points)
    plot = HEIGHT - BOTTOM - TOP
    span = math.log10(LOG_HIGH) - math.log10(LOG_LOW)

    def y(v: float) -> float:
        v = min(max(v, LOG_LOW), LOG_HIGH)
        return round(HEIGHT - BOTTOM - plot * (math.log10(v) - math.log10(LOG_LOW)) / span, 1)

    series = []
    for q, css in ((0.5, "line-p50"), (0.95, "line-p95")):
        name = f"p{round(q * 100)}"
        coords: list[tuple[float, float]] = []
        dots = []
        for i, p in enumerate(summary.points):
            hist = p.wait if which == "wait" else p.run
            value = percentile(hist, summary.bounds, q)
            if value is None:
                continue
            x, yy = _x(i, count), y(value)
            coords.append((x, yy))
            dots.append((x, yy, f"{summary.starts[i]:%Y-%m-%d %H:%MZ}: {name} {bound_text(value)}"))
        series.append(Series(name, css, " ".join(f"{x},{yy}" for x, yy in coords), dots))
    title = "Wait time (due to claim)" if which == "wait" else "Runtime (claim to end)"
    return Chart(
        f"chart-{which}",
        title,
        "seconds, log scale",
        series,
        _x_ticks(summary),
        [(y(t), label) for t, label in TIME_TICKS],
    )


def bound_text(value: float | None) -> str:
    """A percentile as the rollup knows it: at most a bucket's bound."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "> 1h"
    return "≤ " + _time_label(value)


def charts(summary: Summary) -> list[Chart]:
    return [counts_chart(summary), time_chart(summary, "wait"), time_chart(summary, "run")]


def last_hour_chart(minutes: Sequence[dict[str, Any]]) -> Chart:
    """The overview's chart: views.throughput's minutes (ended attempts per minute over
    the last hour, read live from the attempts, not from the rollup), with the same axes
    and legend as the Charts page's throughput chart."""
    points = [Totals(completed=int(m["completed"]), failed=int(m["failed_total"])) for m in minutes]
    whole = Totals()
    for point in points:
        whole.merge(point)
    starts = [m["minute"].astimezone(UTC) for m in minutes]
    summary = Summary(WINDOWS["1h"], [], starts, points, [], whole)
    return counts_chart(summary, "chart-last-hour")

"""The Charts page's arithmetic (pgworkerd/web/charts.py), without a database: the windows
offered and refused, percentiles from the rollup's histograms, and the rows of a window
put into its points and per-handler totals."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from pgworkerd.ops.metrics import LATENCY_BUCKETS
from pgworkerd.web import charts

BOUNDS = [b for b in LATENCY_BUCKETS if not math.isinf(b)]


@pytest.mark.parametrize("value", ["100y", "1H", "6h ", "3600", "7d\x00", "x" * 10_000])
def test_only_the_offered_windows_are_accepted(value: str) -> None:
    with pytest.raises(charts.BadWindow, match="the charts cover one of 1h, 6h, 24h, 7d") as e:
        charts.window_of(value)
    assert len(str(e.value)) < 200  # a hostile value is not echoed whole
    assert charts.window_of(None).name == charts.DEFAULT_WINDOW


def test_a_percentile_is_the_upper_bound_of_its_bucket() -> None:
    counts = [0] * (len(BOUNDS) + 1)
    counts[5] = 90  # values in [0.1, 0.25)
    counts[9] = 10  # values in [2.5, 5)
    assert charts.percentile(counts, BOUNDS, 0.5) == 0.25
    assert charts.percentile(counts, BOUNDS, 0.9) == 0.25
    assert charts.percentile(counts, BOUNDS, 0.95) == 5.0
    counts[-1] = 1000  # past the last bound: more than an hour
    assert math.isinf(charts.percentile(counts, BOUNDS, 0.99) or 0)
    assert charts.bound_text(math.inf) == "> 1h"
    assert charts.percentile([0] * 17, BOUNDS, 0.5) is None
    assert charts.bound_text(None) == "-"


def test_rows_land_in_their_points_and_handlers() -> None:
    window = charts.WINDOWS["6h"]  # minute rows, points of 5 minutes
    now = datetime(2026, 11, 27, 12, 2, 30, tzinfo=UTC)
    first = charts.first_start(window, now)
    assert first == datetime(2026, 11, 27, 6, 5, tzinfo=UTC)  # 72 points, the last at 12:00

    def row(minute: datetime, handler: str, done: int) -> dict[str, object]:
        hist = [0] * 17
        hist[5] = done
        return {
            "bucket_start": minute,
            "handler": handler,
            "completed": done,
            "failed": 1,
            "run_counts": hist,
            "wait_counts": hist,
        }

    rows = [
        row(first - timedelta(minutes=1), "old", 50),  # before the window: not shown
        row(first, "a", 2),
        row(first + timedelta(minutes=4), "a", 3),  # the same 5-minute point
        row(datetime(2026, 11, 27, 12, 1, tzinfo=UTC), "b", 7),  # the last point
    ] + [row(first, f"h{n:02}", 1) for n in range(25)]
    summary = charts.summarize(rows, window, now, BOUNDS)
    assert len(summary.points) == 72
    assert summary.points[0].completed == 2 + 3 + 25
    assert summary.points[-1].completed == 7
    names = [name for name, _ in summary.handlers]
    assert names[:2] == ["b", "a"] and names[-1] == charts.OTHER_HANDLERS
    assert len(names) == charts.HANDLERS_SHOWN + 1
    assert summary.whole.completed == 2 + 3 + 7 + 25
    assert summary.whole.failed == 3 + 25
    throughput, wait, run = charts.charts(summary)
    assert [s.name for s in throughput.series] == ["completed", "failed"]
    assert [s.name for s in run.series] == ["p50", "p95"]
    assert wait.y_ticks[0][1] == "1 ms" and wait.y_ticks[-1][1] == "1 h"
    assert throughput.title == "Ended attempts per 5 minutes"


@pytest.mark.parametrize(
    ("peak", "top"), [(0, 4), (3, 4), (5, 8), (9, 20), (100, 100), (101, 200), (1234, 2000)]
)
def test_a_count_axis_has_four_whole_steps(peak: int, top: int) -> None:
    assert charts._nice_top(peak) == top
    assert (top / 4) == int(top / 4)

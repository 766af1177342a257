"""The job page's progress convention (pgworkerd/web/progress.py): a fraction from `pct`
or `step`/`of`, nothing from anything else, and elapsed time and an ETA while it runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from pgworkerd.web import progress


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"pct": 17}, 0.17),
        ({"pct": 250}, 1.0),
        ({"pct": -3}, 0.0),
        ({"step": 3, "of": 12}, 0.25),
        ({"pct": 40, "step": 1, "of": 2}, 0.4),  # pct first
        ({"step": 3, "of": 0}, None),
        ({"step": 3}, None),
        ({"pct": "17"}, None),
        ({"pct": True}, None),
        ({"step": 1, "of": 10**400}, None),
        ({"row": 5, "of": 9}, None),
        ([1, 2], None),
        ("50%", None),
        (None, None),
    ],
)
def test_a_fraction_only_from_the_documented_keys(value: object, expected: float | None) -> None:
    assert progress.fraction(value) == expected


def test_elapsed_and_eta_while_running_only() -> None:
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    row = {
        "status": "running",
        "started_at": now - timedelta(seconds=60),
        "progress": json.dumps({"step": 1, "of": 4}, indent=2),
        "progress_chars": len(json.dumps({"step": 1, "of": 4})),
    }
    shown = progress.of_job(row, now)
    assert shown == {
        "fraction": 0.25,
        "percent": 25.0,
        "elapsed_seconds": 60.0,
        "eta_seconds": 180.0,
    }
    finished = progress.of_job({**row, "status": "completed"}, now)
    assert finished is not None and finished["eta_seconds"] is None
    # a progress value cut for the page (longer than shown) is not parsed
    assert progress.of_job({**row, "progress_chars": 10**6}, now) is None
    assert progress.of_job({**row, "progress": '{"pct": 5'}, now) is None

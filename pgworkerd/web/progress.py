"""How the job page reads a job's progress: a fraction when the handler reports one, by
the convention documented in docs/guide/handlers.md ("Progress the dashboard draws"):

- `{"pct": 17}`: a percentage, 0 to 100;
- `{"step": 3, "of": 18}`: the step done out of how many (of > 0).

Anything else (any JSON a handler chooses) has no fraction and is shown as JSON only.
From the fraction and the attempt's start: the time it has run and an estimate of what is
left (elapsed * (1 - f) / f: a straight line, as good as the handler's steps are even).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any


def fraction(progress: Any) -> float | None:
    """The fraction done (0..1) a progress value states, else None."""
    if not isinstance(progress, dict):
        return None
    pct = _number(progress.get("pct"))
    if pct is not None:
        return min(max(pct / 100.0, 0.0), 1.0)
    step, of = _number(progress.get("step")), _number(progress.get("of"))
    if step is not None and of is not None and of > 0:
        return min(max(step / of, 0.0), 1.0)
    return None


def _number(value: Any) -> float | None:
    """A finite JSON number as a float (not a boolean, not a numeric string), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # JSON holds integers of any size
        return None
    return number if math.isfinite(number) else None


def of_job(job: dict[str, Any], now: datetime | None = None) -> dict[str, Any] | None:
    """For the job page (views.job_shown's row: progress as JSON text, progress_chars its
    length): {"fraction", "percent", "elapsed_seconds", "eta_seconds"} when the progress
    states a fraction (elapsed and ETA only while it runs), else None."""
    text, chars = job.get("progress"), job.get("progress_chars")
    if not isinstance(text, str) or chars is None or len(text) < chars:
        return None  # no progress, or cut (a page shows that much at most): not parsed
    try:
        done = fraction(json.loads(text))
    except ValueError:
        return None
    if done is None:
        return None
    elapsed = eta = None
    started = job.get("started_at")
    if job.get("status") == "running" and isinstance(started, datetime):
        elapsed = max(0.0, ((now or datetime.now(UTC)) - started).total_seconds())
        if 0 < done < 1:
            eta = elapsed * (1 - done) / done
    return {
        "fraction": done,
        "percent": math.floor(done * 1000) / 10,
        "elapsed_seconds": elapsed,
        "eta_seconds": eta,
    }

"""The templates' filters: every value a page renders goes through one of them.

Every value shown comes from rows that applications and enqueuers wrote, so templates
render nothing unescaped (Jinja2 autoescaping; no `|safe` anywhere) and the `t` filter
also writes control and bidirectional-override characters as visible escapes. Each value
is bounded to SHOWN_CHARS characters.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint

from pgworkerd.describe import printable
from pgworkerd.durations import format_duration
from pgworkerd.sizes import format_size
from pgworkerd.web.progress import fraction

# Characters of one value (payload, progress, checkpoint, result, an error, a log's head
# or tail) a page shows at most; the rest is a "download raw" link away. The job page
# reads no more than this from the database either.
SHOWN_CHARS = 64 * 1024

filters = Blueprint("filters", __name__)


def _bounded(text: str) -> str:
    """At most SHOWN_CHARS of a text (every value a page renders goes through this)."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}… [{len(text) - SHOWN_CHARS} more characters not shown]"


@filters.app_template_filter("t")
def _text(value: Any) -> str:
    """A value as one inert line (autoescaping then makes it inert HTML)."""
    return "" if value is None else printable(_bounded(str(value)))


@filters.app_template_filter("pretty")
def _pretty(value: Any) -> str:
    """JSON from a row, indented; line breaks kept, other control characters escaped."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return printable(_bounded(text), keep="\n")


@filters.app_template_filter("multiline")
def _multiline(value: Any) -> str:
    return "" if value is None else printable(_bounded(str(value)), keep="\n\t")


@filters.app_template_filter("when")
def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return _text(value)  # a timestamp Python cannot hold comes as the server's text


@filters.app_template_filter("age")
def _age(seconds: Any) -> str:
    return "-" if seconds is None else format_duration(float(seconds), rounded=True)


@filters.app_template_filter("size")
def _size(value: Any) -> str:
    """Bytes as the CLI writes them ("2.1 GiB", "300 KiB")."""
    return "-" if value is None else format_size(float(value))


# Characters of an error's one-line gist (the summary of its collapsed traceback).
GIST_CHARS = 200


@filters.app_template_filter("gist")
def _gist(value: Any) -> str:
    """An error in one line: its last non-blank line (a Python traceback's exception),
    cut to GIST_CHARS; the whole error is one click away (<details>)."""
    lines = [line for line in str(value or "")[-SHOWN_CHARS:].splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if len(last) > GIST_CHARS:
        last = last[:GIST_CHARS] + "…"
    return printable(last) + (f" (+ {len(lines) - 1} lines)" if len(lines) > 1 else "")


@filters.app_template_filter("duration")
def _duration(job: Any) -> str:
    """A listed job's last run: finished_at - started_at (started_at is its last
    attempt's start); "-" when it has not both."""
    started, finished = job.get("started_at"), job.get("finished_at")
    if not (isinstance(started, datetime) and isinstance(finished, datetime)):
        return "-"
    return format_duration(max(0.0, (finished - started).total_seconds()), rounded=True)


@filters.app_template_filter("fraction")
def _fraction(progress: Any) -> float | None:
    """The fraction done a progress value states (web/progress.py's convention), or None."""
    return fraction(progress)

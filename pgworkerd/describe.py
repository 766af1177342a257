"""Errors as one bounded line, for last_error and the log: an exception raised by a job's
data (a loader, the JSON codec) may quote that data, which can be megabytes long."""

from __future__ import annotations

MAX_DETAIL = 200


def short_error(exc: BaseException) -> str:
    """`Type: message` on one line, the message cut at MAX_DETAIL characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > MAX_DETAIL:
        text = text[:MAX_DETAIL] + "..."
    return f"{type(exc).__name__}: {text}"

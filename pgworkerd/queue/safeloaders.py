"""Loaders that never refuse a value the database holds: rows come from applications and
from the enqueuer role, and a value Python cannot hold (a timestamp of year 20000, a
5,000-digit JSON integer) must not turn a read (`pgworkerd jobs`, a dashboard page) into
a traceback. Shared by the CLI (cli/display.py re-exports them) and the dashboard."""

from __future__ import annotations

import json
import math
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.types.datetime import TimestamptzLoader

__all__ = ["RawJson", "register_safe_loaders"]


class RawJson(str):
    """JSON text from the database that Python's json could not load (still valid JSON):
    a str, so `--json` output carries it as a string, and text output shows it as is."""


class _TextFallbackTimestamptzLoader(TimestamptzLoader):
    """timestamptz as datetime, or as the server's text when Python's datetime cannot hold
    it ('-infinity', 'infinity', years after 9999): shown as the database stores it."""

    def load(self, data: Any) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError:
            return bytes(data).decode("utf-8", "replace")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON, but Python would print Infinity
        raise ValueError(f"number out of range for a float: {text[:20]}")
    return value


class _TextFallbackJsonLoader(Loader):
    """json/jsonb as Python objects, or as RawJson (its text) when Python's json refuses it:
    an integer longer than Python's int-string limit, nesting deeper than its recursion
    limit, a number beyond a float's range."""

    def load(self, data: Any) -> Any:
        text = bytes(data).decode("utf-8", "replace")
        try:
            return json.loads(text, parse_float=_finite_float)
        except (ValueError, RecursionError):
            return RawJson(text)


def register_safe_loaders(conn: psycopg.Connection) -> None:
    """Make every read on `conn` load hostile timestamps and JSON instead of raising.

    Text format only: the CLI's cursors never ask for binary results.
    """
    conn.adapters.register_loader("timestamptz", _TextFallbackTimestamptzLoader)
    conn.adapters.register_loader("jsonb", _TextFallbackJsonLoader)
    conn.adapters.register_loader("json", _TextFallbackJsonLoader)

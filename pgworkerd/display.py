"""What the CLI needs to show rows written by others: control characters escaped, and
loaders that never refuse a value the database holds.

Job rows come from applications and from the enqueuer role, so the CLI treats every text
field as hostile: an ESC sequence in a handler name must not retitle or clear the
operator's terminal, a newline must not forge a line of `pgworkerd jobs`, and a value
Python cannot hold (a timestamp of year 20000, a 5,000-digit JSON integer) must not turn a
read-only command into a traceback.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import psycopg
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import JsonbLoader, JsonLoader

# Categories a terminal may act on or that hide text: C0/C1 controls (ESC, CR, BEL…),
# format characters (bidi overrides that reorder what is shown), line/paragraph separators
# and lone surrogates.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(value: Any) -> str:
    """str(value) with every control or invisible formatting character written as an
    escape (\\n, \\x1b, \\u202e), so it prints as exactly one inert piece of one line."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to escape (space counts as printable)
        return text
    return "".join(
        _escape_char(ch) if unicodedata.category(ch) in _HIDDEN_CATEGORIES else ch for ch in text
    )


class _TextFallbackTimestamptzLoader(TimestamptzLoader):
    """timestamptz as datetime, or as the server's text when Python's datetime cannot hold
    it ('-infinity', 'infinity', years after 9999): shown as the database stores it."""

    def load(self, data: Any) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError:
            return bytes(data).decode("utf-8", "replace")


class _TextFallbackJsonbLoader(JsonbLoader):
    """jsonb as Python objects, or as its JSON text when Python's json refuses it (an
    integer longer than Python's int-string limit, nesting deeper than its recursion
    limit). The text is still valid JSON; the CLI shows it as a string."""

    def load(self, data: Any) -> Any:
        try:
            return super().load(data)
        except (ValueError, RecursionError):
            return bytes(data).decode("utf-8", "replace")


class _TextFallbackJsonLoader(JsonLoader):
    def load(self, data: Any) -> Any:
        try:
            return super().load(data)
        except (ValueError, RecursionError):
            return bytes(data).decode("utf-8", "replace")


def register_safe_loaders(conn: psycopg.Connection) -> None:
    """Make every read on `conn` load hostile timestamps and JSON instead of raising.

    Text format only: the CLI's cursors never ask for binary results.
    """
    conn.adapters.register_loader("timestamptz", _TextFallbackTimestamptzLoader)
    conn.adapters.register_loader("jsonb", _TextFallbackJsonbLoader)
    conn.adapters.register_loader("json", _TextFallbackJsonLoader)

"""Text for people, from data others wrote: errors as one bounded line (an exception
raised by a job's data may quote that data, megabytes of it), and names and messages made
inert for a terminal, a log line or a dashboard (printable)."""

from __future__ import annotations

import unicodedata

# Categories a terminal may act on or that hide text: C0/C1 controls (ESC, CR, BEL...),
# format characters (bidi overrides that reorder what is shown), line/paragraph separators
# and lone surrogates.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

MAX_DETAIL = 200


def short_error(exc: BaseException) -> str:
    """`Type: message` on one line, the message cut at MAX_DETAIL characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > MAX_DETAIL:
        text = text[:MAX_DETAIL] + "..."
    return f"{type(exc).__name__}: {text}"


def printable(value: object, *, keep: str = "") -> str:
    """str(value) with every control or invisible formatting character (but those in
    `keep`) written as an escape (\\n, \\x1b, \\u202e), so that it prints as one inert
    piece of one line."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to escape (space counts as printable)
        return text
    return "".join(
        _escape_char(ch)
        if ch not in keep and unicodedata.category(ch) in _HIDDEN_CATEGORIES
        else ch
        for ch in text
    )


def _escape_char(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

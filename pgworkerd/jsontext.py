"""JSON text that PostgreSQL's jsonb accepts, checked where a value is produced (in the
child, for the handler's result, progress and checkpoint) and where it arrives (in the
parent): one value jsonb would refuse must fail its own job, never the statement that
carries every job's lease or completion. Light on imports: the child loads it."""

from __future__ import annotations

import json
import re
from typing import Any

# \u0000 in JSON text, as an escape (not an escaped backslash followed by "u0000")
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable_json(value: Any) -> str:
    """`value` as (ASCII) JSON text that jsonb accepts; raises ValueError, TypeError or
    RecursionError if there is none: not JSON-serialisable, not finite, or a string that
    PostgreSQL cannot store (a NUL character, or a lone surrogate such as a file name
    decoded with surrogateescape)."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    # Cheap substring tests first; the exact checks only for text that holds a NUL
    # escape or any surrogate escape (every emoji is a surrogate pair here).
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise ValueError("a string holds a NUL character, which PostgreSQL cannot store")
    if "\\ud" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "a string holds a lone surrogate (not valid Unicode), which PostgreSQL cannot store"
            ) from None
    return text


def storable_text(text: str) -> str:
    """`text` as PostgreSQL text can hold it: a NUL character and lone surrogates (an
    exception's message quoting a file name that is not UTF-8) written as escapes."""
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text

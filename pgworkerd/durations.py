"""Durations as operators write them: "30s", "10m", "1h30m", "250ms", or plain seconds."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration; raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return float(value)
    text = value.strip().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for match in _PART_RE.finditer(text):
        if match.start() != pos:
            break
        total += float(match[1]) * _UNIT_SECONDS[match[2]]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(f'{value!r} is not a duration: write e.g. "30s", "10m", "1h30m", "250ms"')
    return total


def format_duration(seconds: float, *, rounded: bool = False) -> str:
    """`seconds` the way operators write durations.

    Exact (configured values in messages): "250ms", "1.5s", "90m", "72h".
    Rounded (ages, as `pgworkerd status` shows them): never negative, whole seconds and
    minutes, hours and beyond two days days to a tenth: "0s", "5m", "3.2h", "4.5d".
    """
    if rounded:
        seconds = max(0.0, seconds)
    elif seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 120:
        unit, size = "s", 1.0
    elif seconds < 7200:
        unit, size = "m", 60.0
    elif seconds < 172800 or not rounded:
        unit, size = "h", 3600.0
    else:
        unit, size = "d", 86400.0
    value = seconds / size
    if not rounded:
        return f"{value:g}{unit}"
    return f"{value:.0f}{unit}" if size < 3600 else f"{value:.1f}{unit}"

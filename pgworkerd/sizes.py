"""Memory sizes as operators write them ("2GiB", "512MiB", "1.5G", plain bytes) and as
messages show them ("2 GiB", "2.1 GiB")."""

from __future__ import annotations

import re

# Binary units; the SI spellings mean the same here (as in systemd's MemoryMax=): nobody
# sets a memory limit to a decimal gigabyte on purpose.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
# More than any machine has: a typo ("2000TiB") is refused, not treated as no limit.
MAX_SIZE = 1 << 50  # 1 PiB
# Less is a typo ("2" meant as GiB): not even an interpreter fits.
MIN_SIZE = 1 << 20  # 1 MiB


def parse_size(value: str | int, *, minimum: int = MIN_SIZE, maximum: int = MAX_SIZE) -> int:
    """Bytes in a size from `minimum` to `maximum` (default: 1 MiB to 1 PiB, for memory);
    raises ValueError saying which forms are accepted."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f'expected a size like "2GiB", got {type(value).__name__}')
    if isinstance(value, int):
        size = value
    else:
        text = value.strip().lower()
        if text.startswith("-"):
            raise ValueError(f"{value[:40]!r} is negative")
        match = _SIZE_RE.fullmatch(text)
        if match is None or match[2] not in _UNITS:
            raise ValueError(
                f'{value[:40]!r} is not a size: write e.g. "2GiB", "512MiB" (or bytes)'
            )
        size = int(float(match[1]) * _UNITS[match[2]])
    if size < 0:
        raise ValueError(f"{value!r} is negative")
    if size < minimum:
        raise ValueError(f"{value!r} is too small (at least {format_size(minimum)})")
    if size > maximum:
        raise ValueError(f"{value!r} is out of range (at most {format_size(maximum)})")
    return size


def format_size(size: float) -> str:
    """'2 GiB', '2.1 GiB', '512 MiB', '300 KiB': one decimal, dropped when zero."""
    for unit, scale in (
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ):
        if size >= scale:
            value = size / scale
            text = f"{value:.1f}".removesuffix(".0")
            return f"{text} {unit}"
    return f"{int(size)} B"

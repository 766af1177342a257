"""The job page's live log tail: what `pgworkerd logs --follow` prints, served in bounded
steps to a small script (static/tail.js) that polls with a cursor.

The source is the one `logs -f` reads: the job_logs row of one attempt, a head that grows
at its end and a tail whose start moves on once the attempt printed more than [logs]
max_bytes_per_attempt (omitted_bytes counts what lies between). The server keeps no state:
the cursor travels with each poll and says how far the page has shown that attempt:

- ref: which attempt (pages.log_ref: never the lease token, a capability);
- head: characters of the stored head shown;
- omitted: the attempt's omitted_bytes when the tail was last read;
- tail, tailb: characters of the stored tail shown from its start at that time, and the
  job's bytes they stand for (joblogs counts in bytes, the stored text in characters);
- eol: 1 when what the page shows ends a line (or is empty), so an omitted marker starts
  a line of its own.

Each step reads at most STEP_CHARS characters (one substring statement per part), so a
32 MiB log costs no more per poll than a small one; "more" tells the script to ask again
at once. A cursor is the client's: every field is checked and bounded, and a forged one
only moves what this page shows of a log the role may read anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pgworkerd.queue.joblogs import omitted_marker

# Characters one poll returns at most.
STEP_CHARS = 64 * 1024
# The largest value a cursor field may carry: a log is at most 64 MiB (LOG_CAP_MAX).
CURSOR_MAX = 1 << 40

# read(part, start, chars) -> (text, whole length, omitted_bytes) or None (no such log)
PartReader = Callable[[str, int, int], tuple[str, int, int] | None]


class BadCursor(ValueError):
    """A cursor field that is not a bounded count."""


@dataclass
class Cursor:
    head: int = 0
    omitted: int = 0
    tail: int = 0
    tailb: int = 0
    eol: int = 1

    @classmethod
    def parse(cls, args: dict[str, str]) -> Cursor:
        values: dict[str, int] = {}
        for name in ("head", "omitted", "tail", "tailb", "eol"):
            text = args.get(name, "") or str(getattr(cls, name))
            if not (text.isascii() and text.isdigit() and len(text) <= 13):
                raise BadCursor(f"{name} must be a count of characters or bytes")
            value = int(text)
            if value > CURSOR_MAX:
                raise BadCursor(f"{name} is larger than any log")
            values[name] = value
        if values["eol"] > 1:
            raise BadCursor("eol must be 0 or 1")
        return cls(**values)


def raw_length(text: str) -> int:
    """The job's bytes a stored text stands for (each U+FFFD was one invalid byte)."""
    return len(text.encode()) - 2 * text.count("\ufffd")


def _held_back(text: str, finished: bool) -> int:
    # a U+FFFD at the end of a growing text may be half a character the next write completes
    return 1 if not finished and text.endswith("\ufffd") else 0


def _chars_for_bytes(text: str, nbytes: int) -> int:
    """How many characters at the start of `text` stand for `nbytes` job bytes."""
    count, seen = 0, 0
    while count < len(text) and seen < nbytes:
        seen += raw_length(text[count])
        count += 1
    return count


def step(read: PartReader, cursor: Cursor, finished: bool) -> tuple[str, Cursor, bool]:
    """The output after `cursor` (at most about STEP_CHARS characters, with an omitted
    marker where output scrolled away unseen), the cursor after it, and whether more is
    there already. `finished`: the attempt ended (nothing is held back)."""
    found = read("head", cursor.head, STEP_CHARS)
    if found is None:
        return "", cursor, False
    part, head_len, omitted = found
    after = Cursor(**asdict(cursor))
    out = ""
    if part:
        tail_probe = read("tail", 0, 0)
        tail_len = tail_probe[1] if tail_probe else 0
        keep = len(part) - (0 if tail_len else _held_back(part, finished))
        out, after.head = part[:keep], cursor.head + keep
        if cursor.head + len(part) < head_len:
            after.eol = int(out.endswith("\n")) if out else cursor.eol
            return out, after, True  # the rest of the head first
    if omitted != cursor.omitted:
        moved = omitted - cursor.omitted  # job bytes the tail's start moved on
        if moved < 0 or moved >= cursor.tailb:
            missed = max(0, moved - cursor.tailb) if moved >= 0 else 0
            if missed and after.head:
                ends_line = out.endswith("\n") if out else bool(cursor.eol)
                newline = "" if ends_line else "\n"
                out += f"{newline}{omitted_marker(missed)}\n"
            after.tail, after.tailb = 0, 0
        else:
            # what was shown still starts the new tail after `moved` bytes: skip that
            left = cursor.tailb - moved
            shown = read("tail", 0, left)
            text = shown[0] if shown else ""
            skip = _chars_for_bytes(text, left)
            after.tail, after.tailb = skip, raw_length(text[:skip])
        after.omitted = omitted
    found = read("tail", after.tail, STEP_CHARS)
    if found is None:
        return out, after, False
    part, tail_len, _ = found
    keep = len(part) - _held_back(part, finished)
    out += part[:keep]
    after.tail += keep
    after.tailb += raw_length(part[:keep])
    if out:
        after.eol = int(out.endswith("\n"))
    return out, after, after.tail + len(part) - keep < tail_len


def as_json(text: str, cursor: Cursor, more: bool, **fields: Any) -> dict[str, Any]:
    return {"text": text, "more": more, **asdict(cursor), **fields}

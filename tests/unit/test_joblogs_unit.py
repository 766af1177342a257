"""Unit tier: pgworkerd.daemon.joblogs on real files (no database: the write is a list):
attempts of one child kept apart, the head and the tail cut between characters, a flood
read only as far as the tail needs and its file's read part freed, lines copied to the
daemon's log at a bounded rate with the rest counted, nothing left behind."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from pgworkerd.config import LogsConfig
from pgworkerd.daemon import joblogs as joblogs_module
from pgworkerd.daemon.joblogs import JobLogs
from pgworkerd.queue.joblogs import LogWrite
from pgworkerd.worker.capture import path_for

PID = 4242


class Harness:
    """A JobLogs over `tmp_path` with one child's file, a clock the test moves, and the
    writes it made."""

    def __init__(self, tmp_path: Path, **config: object) -> None:
        self.now = 0.0
        self.written: list[list[LogWrite]] = []
        self.path = Path(path_for(str(tmp_path), PID))
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.logs = JobLogs(
            LogsConfig(**config),  # type: ignore[arg-type]
            self.write,
            lambda: True,
            lambda: str(tmp_path),
            clock=lambda: self.now,
        )

    def write(self, entries: list[LogWrite]) -> set[int]:
        self.written.append(entries)
        return {e.job_id for e in entries}

    def child_prints(self, data: bytes) -> None:
        os.write(self.fd, data)

    def tick(self) -> None:
        self.now += joblogs_module.INTERVAL
        self.logs.tick(self.now)

    def last(self, job_id: int) -> LogWrite:
        return [e for batch in self.written for e in batch if e.job_id == job_id][-1]


def test_attempts_of_one_child_are_kept_apart_and_silent_ones_write_nothing(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.logs.begin(1, 10, 1, PID)
    h.child_prints(b"one\n")
    h.tick()
    assert not h.path.exists()  # (unlinked once opened: nothing is left if anyone dies)
    assert h.last(1) == LogWrite(1, 10, 1, "one\n", "", 4, 0, False)
    h.child_prints(b"two\n")
    h.logs.end(1)
    h.logs.begin(2, 20, 1, PID)
    h.child_prints(b"second job\n")
    h.logs.end(2)
    h.logs.begin(3, 30, 1, PID)
    h.logs.end(3)  # printed nothing
    h.tick()
    assert h.last(1) == LogWrite(1, 10, 1, "one\ntwo\n", "", 8, 0, True)
    assert h.last(2) == LogWrite(2, 20, 1, "second job\n", "", 11, 0, True)
    assert all(e.job_id != 3 for batch in h.written for e in batch)
    h.tick()
    assert len(h.written) == 2  # nothing new: no write
    h.logs.child_exited(PID)
    assert h.logs.next_deadline() is None


def test_head_and_tail_are_cut_between_characters(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_bytes_per_attempt=8192)
    h.logs.begin(1, 10, 1, PID)
    # 4095 ASCII bytes then "é" (2 bytes) across the head's end at 4096
    h.child_prints(b"a" * 4095 + "é".encode() + b"b" * 10000 + "€".encode() + b"z" * 4093)
    h.logs.end(1)
    h.tick()
    entry = h.last(1)
    assert entry.head == "a" * 4095
    assert entry.tail.endswith("z" * 4093) and entry.tail.startswith("€")
    assert entry.total_bytes == 4095 + 2 + 10000 + 3 + 4093
    assert entry.omitted_bytes == entry.total_bytes - 4095 - len(entry.tail.encode())
    assert "\ufffd" not in entry.head + entry.tail


def test_a_flood_is_read_only_as_far_as_the_tail_needs_and_freed(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_bytes_per_attempt=8192, forward_lines_per_second=0)
    h.logs.begin(1, 10, 1, PID)
    line = b"x" * 99 + b"\n"
    h.child_prints(b"first\n" + line * 200_000 + b"last\n")  # ~20 MB
    h.tick()
    entry = h.last(1)
    assert entry.head is not None and entry.tail is not None
    assert entry.head.startswith("first\n") and entry.tail.endswith("x\nlast\n")
    assert entry.total_bytes == 6 + 100 * 200_000 + 5
    fd = h.logs.files[PID].fd
    assert fd is not None
    assert os.fstat(fd).st_blocks * 512 < 1 << 20  # the read part's blocks are freed


def test_lines_reach_the_daemons_log_at_a_bounded_rate_and_the_rest_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path, forward_lines_per_second=3)
    caplog.set_level(logging.INFO, logger="pgworkerd")
    h.logs.begin(7, 70, 2, PID)
    h.child_prints(b"".join(b"line %d\n" % i for i in range(10)) + b"no newline")
    h.tick()
    h.logs.end(7)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:3] == [f"job 7 attempt 2 | line {i}" for i in range(3)]
    assert any("7 line(s) of output not copied to this log (over 3 lines/s)" in m for m in messages)
    # a new second: the unended line is copied at the end
    assert messages[-1] == "job 7 attempt 2 | no newline"
    assert caplog.records[0].fields == {"job_id": 7, "attempt": 2, "event": "output"}  # type: ignore[attr-defined]


def test_a_file_never_opened_is_removed_with_its_child(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.logs.child_exited(PID)
    assert not h.path.exists()


def test_something_else_than_a_file_at_its_place_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path)
    h.path.unlink()
    os.mkfifo(h.path)  # (a handler runs as the daemon's user: it could put one there)
    h.logs.begin(1, 10, 1, PID)
    h.tick()
    h.logs.end(1)  # returns at once: nothing waits on the FIFO
    assert "no output captured" in caplog.text and "not a regular file" in caplog.text
    assert not any(h.written)


# -- `logs -f` over stored text (N12 of the 2026-11-26 audit) --------------------------------


def _as_stored(stream: bytes, head_max: int, tail_max: int, finished: bool) -> dict[str, Any]:
    """The job_logs row the daemon writes for `stream` so far (daemon/joblogs.py's rules:
    a head of whole characters once full, a rolling tail starting on a whole one)."""
    from pgworkerd.daemon.joblogs import _whole_chars_end, _whole_chars_start
    from pgworkerd.queue.joblogs import storable

    head = stream[:head_max]
    if len(head) >= head_max:
        head = _whole_chars_end(head)
    rest = stream[len(head) :]
    tail = rest[-tail_max:] if rest else b""
    if len(rest) > tail_max:
        tail = _whole_chars_start(tail)
    return {
        "head": storable(head),
        "tail": storable(tail),
        "total_bytes": len(stream),
        "omitted_bytes": len(stream) - len(head) - len(tail),
        "finished": finished,
    }


def _followed(raw: bytes, polls: list[int], head_max: int, tail_max: int) -> str:
    from pgworkerd.queue.joblogs import Follower

    follower = Follower()
    out = ""
    for at in [*polls, len(raw)]:
        out += follower.next_text(_as_stored(raw[:at], head_max, tail_max, at == len(raw)))
    return out


def test_follow_counts_stored_text_after_invalid_utf8() -> None:
    """The audit's printer: invalid UTF-8 and NULs, then 20 ticks, read between writes
    and in the middle of a character: every tick once (it printed 25 for 20 before)."""
    from pgworkerd.queue.joblogs import storable

    raw = b"\xff\xfe\x00\x00\xc3\x28" + b"".join(f"tick {i}\n".encode() for i in range(20))
    raw += "caf\u00e9 \u2603\n".encode() + b"\xc3"  # a cut character at the very end
    polls = sorted({1, 3, 5, 6, 7, *range(6, len(raw), 8), len(raw) - 3, len(raw) - 1})
    out = _followed(raw, polls, head_max=1 << 20, tail_max=1 << 20)
    assert out == storable(raw)
    assert out.count("tick ") == 20
    # and a character split between two polls of a growing head comes out whole
    assert _followed("\u2603x".encode(), [1, 2], 1 << 10, 1 << 10) == "\u2603x"


def test_follow_through_a_rolling_tail() -> None:
    """Past the head, the tail rolls: polled often enough, every byte is printed once;
    polled too rarely, a marker says how much was never seen."""
    from pgworkerd.queue.joblogs import storable

    lines = [f"line {i} \xff\u00e9\n".encode("latin-1", "replace") for i in range(400)]
    raw = b"".join(lines)  # invalid UTF-8 on every line
    often = list(range(0, len(raw), 37))
    assert _followed(raw, often, head_max=200, tail_max=400) == storable(raw)
    rarely = _followed(raw, [300, len(raw) // 2], head_max=200, tail_max=400)
    assert "bytes omitted ...]" in rarely
    assert rarely.endswith(_as_stored(raw, 200, 400, True)["tail"])
    assert rarely.count("line 399") == 1

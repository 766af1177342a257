"""Process helpers read from /proc, for the tests and the benchmarks alike (bench/ puts
tests/support on sys.path for this module). Standard library only: the benchmarks run
in venvs without pytest."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if the
    process is gone. The name may hold spaces and parentheses: split after the last ")"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # FileNotFoundError, ProcessLookupError: gone meanwhile
        return None
    return stat.rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    """CPU time `pid` has used so far (user + system), in seconds."""
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    # utime and stime are fields 14 and 15 of stat; fields[0] here is field 3 (the state)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_state(pid: int) -> str | None:
    """The /proc state letter of `pid`, or None if it no longer exists."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def is_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped (PID 1 here may not reap)."""
    return process_state(pid) in (None, "Z", "X")


def process_title(pid: int) -> str:
    """The process title as `ps` shows it (setproctitle rewrites argv in place)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry.name)
            if fields:
                found[int(entry.name)] = int(fields[1])
    return found


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [child for child, parent in parents().items() if parent == pid]


def descendants(root: int) -> set[int]:
    """`root` and every process below it."""
    by_parent: dict[int, list[int]] = {}
    for child, parent in parents().items():
        by_parent.setdefault(parent, []).append(child)
    found = {root}
    todo = [root]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def marked(marker: str) -> list[int]:
    """The live processes whose argv holds `marker` (a walk over all of /proc; zombies
    count as gone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv and process_state(int(entry.name)) not in (None, "Z", "X"):
            found.append(int(entry.name))
    return found

"""Handlers for the accounting and memory-limit tests (tests/acceptance/test_accounting.py):
known work, so what an attempt's history says can be checked against it."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from typing import Any

from pgworkerd.worker import JobContext

MIB = 1 << 20


def _touch(size: int) -> bytearray:
    """`size` bytes really resident: every page written."""
    block = bytearray(size)
    for i in range(0, size, 4096):
        block[i] = 1
    return block


def burn_and_touch(job: JobContext) -> dict[str, Any]:
    """About `cpu` seconds of CPU in this process, `mib` MiB resident at once."""
    block = _touch(int(job.payload.get("mib", 200)) * MIB)
    deadline = time.process_time() + float(job.payload.get("cpu", 1.0))
    while time.process_time() < deadline:  # (a system call: look rarely)
        sum(range(20_000))
    del block
    return {"pid": os.getpid()}


def allocate(job: JobContext) -> dict[str, Any]:
    """Hold `mib` MiB for `hold` seconds, in this process or (`subprocess`: true) in a
    child process of its own session, so only a tree walk finds it."""
    mib, hold = int(job.payload["mib"]), float(job.payload.get("hold", 3.0))
    if job.payload.get("subprocess"):
        code = (
            f"import time; b = bytearray({mib * MIB}); "
            f"[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; time.sleep({hold})"
        )
        subprocess.run([sys.executable, "-c", code], check=True, start_new_session=True)
    else:
        block = _touch(mib * MIB)
        time.sleep(hold)
        del block
    return {"pid": os.getpid()}


_KEPT: list[bytearray] = []  # a leak: grows the reused child with every job


def leak(job: JobContext) -> dict[str, Any]:
    _KEPT.append(_touch(int(job.payload["mib"]) * MIB))
    return {"pid": os.getpid()}


def burn_then_exit(job: JobContext) -> None:
    """Known work, then an exit without a report: only the kernel's figures (wait4) remain."""
    burn_and_touch(job)
    os._exit(3)


def parse_huge(job: JobContext) -> None:
    """Parse a JSON list of `items` empty objects (about 80 bytes each once parsed) in
    one json.loads call, which holds the GIL throughout: the tree grows past its limit
    while no thread of the child can run. Then sleep in C with the GIL held."""
    doc = bytearray(b"{},") * int(job.payload["items"])  # (one allocation, not three)
    doc[-1:] = b"]"
    doc[0:0] = b"["
    parsed = json.loads(doc)
    ctypes.PyDLL(None).sleep(300)
    del parsed

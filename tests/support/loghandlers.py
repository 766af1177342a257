"""Handlers for the job log tests (tests/acceptance/test_joblogs.py): output of every kind,
at full speed, hostile, and output followed by a death."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

from pgworkerd.worker import JobContext

app_log = logging.getLogger("app.jobs")


def chatter(job: JobContext) -> dict[str, Any]:
    """A line on each way out: print, stderr, logging, a subprocess, a raw write; fails
    its first attempt when asked, so a second one prints too."""
    n = job.attempt
    print(f"stdout line of attempt {n}")
    print(f"stderr line of attempt {n}", file=sys.stderr)
    app_log.info("logging line of attempt %d", n)
    subprocess.run(["echo", f"subprocess line of attempt {n}"], check=True)
    os.write(1, f"raw line of attempt {n}\n".encode())
    if job.payload.get("fail_first") and n == 1:
        raise RuntimeError("first attempt fails")
    return {"pid": os.getpid()}


def numbered(job: JobContext) -> dict[str, Any]:
    """`lines` numbered lines of 100 bytes: `line 00000 ...xxx\\n`."""
    for i in range(int(job.payload["lines"])):
        print(f"line {i:05d} {job.id:>10} ".ljust(99, "x"))
    return {"pid": os.getpid()}


def flood(job: JobContext) -> dict[str, Any]:
    """`mib` MiB of 100-byte lines as fast as print() goes; returns how long it took."""
    line = "y" * 99
    count = int(job.payload["mib"]) * (1 << 20) // 100
    started = time.perf_counter()
    for _ in range(count):
        print(line)
    print("the last line of the flood", flush=True)
    return {"seconds": time.perf_counter() - started}


def last_words(job: JobContext) -> None:
    """Print, then wait to be killed (SIGTERM ignored: only a SIGKILL ends it): by the
    test (kill -9 of the child, its pid in `pidfile`) or by the handler's timeout."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for i in range(200):
        print(f"working {i}")
    print("the last line before the kill", flush=True)
    if job.payload.get("pidfile"):
        with open(job.payload["pidfile"] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(job.payload["pidfile"] + ".tmp", job.payload["pidfile"])
    while True:
        time.sleep(1)


def hostile(job: JobContext) -> None:
    """Bytes no log should pass on as they are."""
    os.write(1, b"nul>\x00<nul\n")
    os.write(1, b"bad utf8>\xff\xfe<\n")
    os.write(1, b"escape>\x1b[2J\x1b]0;pwned\x07<\rcr\n")
    os.write(1, b"tab>\t<\n")


def ticker(job: JobContext) -> None:
    """`ticks` lines, `every` seconds apart, after the bytes `hex` (if given) as written."""
    if job.payload.get("hex"):
        os.write(1, bytes.fromhex(job.payload["hex"]))
    for i in range(int(job.payload["ticks"])):
        print(f"tick {i}", flush=True)
        time.sleep(float(job.payload.get("every", 0.3)))

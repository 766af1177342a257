"""Handlers that do what real jobs do and the daemon's unit sandbox forbids unless a
shipped drop-in (systemd/dropin-*.conf) lifts it: write output files, emit JIT code, open
a device. tests/acceptance/test_systemd_dropins.py runs them under the unit, with and
without each drop-in. Each raises the OSError the sandbox causes, so the job's
last_error carries the errno text the README and the drop-ins' comments quote."""

from __future__ import annotations

import mmap
import os
from typing import Any

from pgworkerd.worker import JobContext


def write_output(job: JobContext) -> dict[str, Any]:
    """A transcode's last step: write the output file into payload["dir"]."""
    path = os.path.join(job.payload["dir"], f"job-{job.id}.out")
    with open(path, "w") as out:
        out.write("rendered\n")
    return {"wrote": path}


def jit_page(job: JobContext) -> dict[str, Any]:
    """What a JIT does first: a page that is writable and executable at once (the code is
    written into it, then run). MemoryDenyWriteExecute=yes refuses it with EPERM."""
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(b"\xc3")  # x86 `ret`: written, never run
    page.close()
    return {"jit": "ok"}


def open_device(job: JobContext) -> dict[str, Any]:
    """Open payload["path"] read-write (a GPU library opens /dev/nvidia* this way)."""
    path = job.payload["path"]
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    os.close(fd)
    return {"opened": path}

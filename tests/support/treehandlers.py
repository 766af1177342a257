"""Handlers that start a process tree, for the containment tests (tests/fault/test_containment.py).

`tree` starts three processes that would outlive a careless job: one in the job's own
process group, one in a new session, and a grandchild double-forked into a session of
its own (its parent exits at once, so it is nobody's child of the handler). Each carries
payload["marker"] in its argv, so the test finds them by walking /proc, and each records
its pid (and what it sees of its environment) to payload["file"] as it starts. The
handler writes its own pid there as well, then ends as payload["then"] says.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from pgworkerd.worker import JobContext

# argv: marker, file, how. Records {"pid", "how", "tmpdir", "fds": what its descriptors
# are} and sleeps for good.
SLEEPER = """
import json, os, sys, time
marker, path, how = sys.argv[1:4]
fds = []
for f in os.listdir("/proc/self/fd"):
    try:
        fds.append(os.readlink("/proc/self/fd/" + f))
    except OSError:
        pass  # the listing's own descriptor, closed by now
line = {"pid": os.getpid(), "how": how, "tmpdir": os.environ.get("TMPDIR"), "fds": fds}
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, (json.dumps(line) + "\\n").encode())
os.close(fd)
while True:
    time.sleep(1000)
"""

# argv: marker, file: fork, the parent exits, the child starts a session and execs SLEEPER.
DOUBLE_FORK = """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        argv = [sys.executable, "-c", sys.argv[3], sys.argv[1], sys.argv[2], "double-fork"]
        os.execv(sys.executable, argv)
    os._exit(0)
os._exit(0)
"""


def record(path: str, line: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def recorded(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def hold_gil(seconds: int) -> None:
    """Sleep `seconds` in C, the GIL held all along (ctypes.PyDLL calls keep it), as a
    handler stuck in a C extension's loop or a huge json.loads does."""
    ctypes.PyDLL(None).sleep(seconds)


def kill_my_children(job: JobContext) -> Any:
    """SIGKILL every child process of the job's child (a careless cleanup, as with
    psutil's children()), then sleep."""
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            for pid in f.read().split():
                os.kill(int(pid), signal.SIGKILL)
    time.sleep(60)


def _spawn_forever(marker: str) -> None:
    """Start marked processes one after another, each stopped and reaped by the next turn
    (`; :` keeps the shell from exec'ing sleep, which would drop the marker from argv)."""
    while True:
        proc = subprocess.Popen(["sh", "-c", "sleep 300; :", marker])
        proc.kill()
        proc.wait()


def _forge_renewals(go: str) -> None:
    """Once the file `go` exists, write a renewal of the running job's lease, a century
    away, to every socket this process holds, again and again: none of them may reach the
    watcher's fence."""
    from pgworkerd.worker import protocol

    while not os.path.exists(go):
        time.sleep(0.05)
    forged = protocol.encode(protocol.LeaseExtended(time.monotonic() + 3e9, None))
    while True:
        for fd in os.listdir("/proc/self/fd"):
            try:
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    continue
                sock = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                continue
            try:
                sock.setblocking(False)
                sock.send(forged)
            except OSError:
                pass
            finally:
                sock.close()
        time.sleep(0.05)


def tree(job: JobContext) -> Any:
    p = job.payload
    marker, path = p["marker"], p["file"]
    sleeper = [sys.executable, "-c", SLEEPER, marker, path]
    subprocess.Popen([*sleeper, "same-group"], close_fds=bool(p.get("close_fds", True)))
    subprocess.Popen([*sleeper, "new-session"], start_new_session=True)
    subprocess.run([sys.executable, "-c", DOUBLE_FORK, marker, path, SLEEPER], check=True)
    deadline = time.monotonic() + 60
    while len(recorded(path)) < 3:  # all three are up before the handler goes on
        if time.monotonic() > deadline:
            raise RuntimeError("the subprocesses did not start")
        time.sleep(0.02)
    record(path, {"pid": os.getpid(), "how": "handler", "tmpdir": os.environ.get("TMPDIR")})
    if p.get("litter"):  # a file left in the attempt's TMPDIR
        with open(os.path.join(os.environ["TMPDIR"], "litter"), "w") as f:
            f.write(str(job.id))
    then = p.get("then", "return")
    if then == "raise":
        raise RuntimeError("the handler fails")
    if then == "sleep":  # until stopped (timeout, cancel, drain, kill)
        time.sleep(float(p.get("seconds", 1000)))
    elif then == "hold_gil":  # in C with the GIL held: no thread of the child runs
        hold_gil(int(p.get("seconds", 1000)))
    elif then == "spawn":  # three threads start processes without a pause, until stopped
        import threading

        for _ in range(2):
            threading.Thread(target=_spawn_forever, args=(marker,), daemon=True).start()
        _spawn_forever(marker)
    elif then == "forge_renewals":  # as its lease runs out unrenewed
        _forge_renewals(p["go"])
    elif then == "compute":  # busy in Python, never sleeping
        end = time.monotonic() + float(p.get("seconds", 1000))
        n = 0
        while time.monotonic() < end:
            n += 1
    return {"pid": os.getpid()}

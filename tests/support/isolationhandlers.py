"""The 2026-11-26 audit's job isolation attacker (security-2026-11-26-repro/
job_isolation.sh and sechandlers.py), as handlers for tests/fault/test_job_uids.py.

A victim (`victim`) prints, keeps a secret in its TMPDIR and sleeps; an attacker job
(`attack`) tries what the audit did to it and to the daemon, and returns what each try
gave ("ok: ..." or the error's name): the test asserts on the job's result. `escapes`
starts the audit's containment escapes (double fork + setsid, clone(CLONE_PARENT) twice,
a user + PID namespace), each a sleeper with payload["marker"] in its argv.

Only modules the fork server preloads (this one's imports) and programs every user may
run: a job child of another uid may not be able to read the interpreter's directory.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import time
from typing import Any

from pgworkerd.worker import JobContext

# A sleeper every user can run, its marker in its argv (walked by the test in /proc).
SLEEPER = ["/usr/bin/python3", "-c", "import time; time.sleep(300)"]
FORGED = "FORGED: written by another job\n"


def victim(job: JobContext) -> Any:
    """Prints, keeps a secret file in its TMPDIR, tells where (heartbeat progress), and
    prints a tick every 0.2 s for payload["seconds"]."""
    tmpdir = os.environ["TMPDIR"]
    secret = os.path.join(tmpdir, "secret")
    with open(secret, "w") as f:
        f.write("the victim's secret\n")
    sleeper = os.fork()
    if sleeper == 0:  # a child of the victim's, for the attacker to kill
        os.execv(SLEEPER[0], [*SLEEPER, "victim-sleeper"])
    print("victim output", flush=True)
    job.heartbeat(
        progress={"pid": os.getpid(), "sleeper": sleeper, "tmpdir": tmpdir, "secret": secret}
    )
    end = time.monotonic() + float(job.payload.get("seconds", 6))
    while time.monotonic() < end:
        print("tick", flush=True)
        time.sleep(0.2)
    os.kill(sleeper, signal.SIGKILL)
    os.waitpid(sleeper, 0)
    return {"survived": True}


def _try(what: Any) -> str:
    try:
        return f"ok: {what()}"
    except OSError as exc:
        return type(exc).__name__


def _write_fd1(pid: int, text: str) -> int:
    fd = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY | os.O_APPEND)
    try:
        return os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(4096).decode(errors="replace").replace("\0", " ")  # (environ's NULs)


def attack(job: JobContext) -> Any:
    """What the audit's job did to another job and to the daemon (payload: the victim's
    pid, its sleeper's pid, its TMPDIR and secret; the daemon's and its fork server's
    pids, the config's path)."""
    p = job.payload
    out: dict[str, Any] = {
        "uid": os.getuid(),
        "write_victim_fd1": _try(lambda: _write_fd1(p["victim"], FORGED)),
        "read_victim_environ": _try(lambda: _read(f"/proc/{p['victim']}/environ")[:20]),
        "list_victim_tmpdir": _try(lambda: os.listdir(p["tmpdir"])),
        "read_victim_secret": _try(lambda: _read(p["secret"])),
        "read_daemon_config": _try(lambda: _read(p["config"])),
        "read_daemon_environ": _try(lambda: _read(f"/proc/{p['daemon']}/environ")[:20]),
        "daemon_fds": _try(lambda: os.listdir(f"/proc/{p['daemon']}/fd")),
        # signal 0: the permission check of a kill without the kill (the daemon lives on)
        "signal_daemon": _try(lambda: os.kill(p["daemon"], 0)),
        "signal_forkserver": _try(lambda: os.kill(p["forkserver"], 0)),
        "signal_victim": _try(lambda: os.kill(p["victim"], 0)),
        # last: the victim's child, SIGKILLed (the audit's kill_pid)
        "kill_victim_sleeper": _try(lambda: os.kill(p["sleeper"], signal.SIGKILL)),
    }
    # what this job's own process holds: its channel to the daemon, its output
    own = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        mode = os.fstat(int(fd)).st_mode if target.startswith("/") else 0
        own.append([int(fd), target, stat.filemode(mode) if mode else ""])
    out["own_fds"] = own
    return out


# -- containment escapes (sechandlers.py) --------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_clone = 56  # x86_64
_CLONE_PARENT = 0x00008000
_SIGCHLD = 17


def _clone_parent() -> int:
    """fork(), but the new process is a child of our parent (CLONE_PARENT)."""
    _libc.syscall.restype = ctypes.c_long
    pid = _libc.syscall(_SYS_clone, _CLONE_PARENT | _SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone(CLONE_PARENT)")
    return pid


def escapes(job: JobContext) -> Any:
    """clone(CLONE_PARENT) twice (the survivor is a child of the daemon), double fork +
    setsid, and unshare -Urpf; each ends in a sleeper marked `marker` + how. Then sleeps
    payload["seconds"] and returns (or the test ends the attempt before)."""
    marker = job.payload["marker"]
    pid = _clone_parent()
    if pid == 0:  # a child of the job child's parent (the daemon) now
        if _clone_parent() == 0:  # and again: still the daemon's
            os.execv(SLEEPER[0], [*SLEEPER, marker, "clone-parent"])
        os._exit(0)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(SLEEPER[0], [*SLEEPER, marker, "double-fork"])
        os._exit(0)
    if os.fork() == 0:
        os.execv("/usr/bin/unshare", ["unshare", "-Urpf", *SLEEPER, marker, "userns"])
    time.sleep(float(job.payload.get("seconds", 1)))  # (the test ends it, or it returns)
    return {"escaped": True}


def allocate(job: JobContext) -> Any:
    """Hold payload["mib"] MiB for 60 s in a subprocess of its own session (only a walk of
    the tree finds it): the memory limit must stop it."""
    mib = int(job.payload["mib"])
    code = (
        f"import time; b = bytearray({mib} << 20); "
        "[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; time.sleep(60)"
    )
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.execv(SLEEPER[0], [SLEEPER[0], "-c", code])
    os.waitpid(pid, 0)
    return {"held": mib}


def probe_daemon(job: JobContext) -> Any:
    """Under a systemd unit: this job's uid, and whether it can signal its daemon (its
    parent), read the daemon's /proc environment and the config at payload["config"]."""
    daemon = os.getppid()
    return {
        "uid": os.getuid(),
        "signal_daemon": _try(lambda: os.kill(daemon, 0)),
        "read_daemon_environ": _try(lambda: _read(f"/proc/{daemon}/environ")[:20]),
        "read_daemon_config": _try(lambda: _read(job.payload["config"])[:20]),
    }

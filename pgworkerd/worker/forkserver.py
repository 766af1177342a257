"""The fork server: a fresh interpreter with no threads and no connections that preloads
the handler modules and forks job children on request.

Why a separate exec'd process: the parent runs database connections (and may run
threads); forking it could hand a child a locked mutex or a live connection. The fork
server is started with posix_spawn, so it is clean by construction, and it can be
restarted (after a crash or a reload) at any time.

Each child is forked twice (fork server -> short-lived middle -> child) so that the child
is orphaned at once and re-parented to the daemon, which is a child subreaper: the daemon
then reaps its children itself and sees their true exit status.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import socket
import struct
import sys
import traceback
from typing import Any

# PR_SET_CHILD_SUBREAPER: orphaned descendants are re-parented to the caller.
PR_SET_CHILD_SUBREAPER = 36
# Children asked for in one message, forked by one middle process (two descriptors each:
# the kernel passes at most 253 in one message).
MAX_BATCH = 64


class ForkServer:
    """The parent's handle on a running fork server."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock

    @classmethod
    def start(cls, modules: list[str], settings: dict[str, Any]) -> ForkServer:
        """Spawn a fork server that preloads `modules`; raises RuntimeError naming an
        import failure (the message comes back from the fork server)."""
        parent_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = json.dumps({"modules": modules, "settings": settings, "daemon_pid": os.getpid()})
        # -P: `-m` would put the working directory first on sys.path, so a json.py there
        # (perhaps written by another user into a shared directory) would run in here.
        # Handler modules come from PYTHONPATH and site-packages, as in the daemon itself.
        argv = [
            sys.executable,
            "-P",
            "-m",
            "pgworkerd.worker.forkserver",
            str(server_end.fileno()),
            config,
        ]
        os.set_inheritable(server_end.fileno(), True)
        try:
            # setpgroup=0: its own process group, so a Ctrl-C in the terminal reaches only
            # the daemon, which then drains.
            pid = os.posix_spawn(sys.executable, argv, child_environment(), setpgroup=0)
        finally:
            server_end.close()
        server = cls(pid, parent_end)
        reply = server._read_reply()
        if reply.get("ready") is not True:
            server.stop()
            raise RuntimeError(reply.get("error") or "fork server did not start")
        return server

    def _read_reply(self) -> dict[str, Any]:
        data = b""
        while not data.endswith(b"\n"):
            chunk = self.sock.recv(65536)
            if not chunk:
                return {"error": "fork server exited during start-up"}
            data += chunk
        return json.loads(data)

    def spawn(self, child_socks: list[socket.socket], uids: list[int] | None = None) -> None:
        """Ask for one child per two sockets (its own, then its watcher's: passed by
        SCM_RIGHTS, all in one message: at most MAX_BATCH children); with `uids`, the
        child of each pair runs as the uid at the same place ([worker] job_uids,
        pgworkerd.worker.identity)."""
        message = b"f" if uids is None else b"u" + struct.pack(f"<{len(uids)}I", *uids)
        socket.send_fds(self.sock, [message], [s.fileno() for s in child_socks])

    def stop(self) -> None:
        """Closing the socket ends the fork server; children it made are unaffected."""
        self.sock.close()


# systemd's notification variables are the parent's alone.
_SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def child_environment() -> dict[str, str]:
    """The daemon's environment minus what is the daemon's alone: every PG* variable
    (libpq's connection settings and credentials: PGPASSWORD, PGPASSFILE, PGSERVICEFILE,
    PGSSLKEY..., and PGWORKERD_DSN / _CONFIG / _SCHEMA) and systemd's notification socket.
    Job children never connect as the daemon; a handler that needs a database reads its
    own settings (README: "Handlers and their own database")."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("PG") and k not in _SYSTEMD_ONLY
    }


def set_child_subreaper() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _serve(sock: socket.socket, config: dict[str, Any]) -> None:
    from pgworkerd.worker import child

    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 + 4 * MAX_BATCH, 2 * MAX_BATCH)
        except InterruptedError:
            continue
        if not fds:
            return  # the daemon closed the socket (or died): nothing more to fork
        pairs = list(zip(fds[0::2], fds[1::2], strict=False))
        uids: list[int | None] = [None] * len(pairs)
        if msg[:1] == b"u":
            uids = (
                list(struct.unpack(f"<{len(pairs)}I", msg[1:]))
                if len(msg) == 1 + 4 * len(pairs)
                else []
            )
        if len(fds) % 2 or len(uids) != len(pairs):  # never from our daemon: fork nothing
            for fd in fds:
                os.close(fd)
            continue
        # One middle process for the whole batch: a fork and an exit of this whole
        # interpreter per batch, not per child (with a fresh process per job that was a
        # quarter of the CPU a job cost).
        middle = os.fork()
        if middle == 0:
            try:
                for (fd, watch_fd), uid in zip(pairs, uids, strict=True):
                    if os.fork() == 0:
                        sock.close()
                        for other in fds:  # a sibling's socket held here would hide its EOF
                            if other not in (fd, watch_fd):
                                os.close(other)
                        settings = config["settings"]
                        if uid is not None:
                            settings = {**settings, "job_uid": uid}
                        child.main(fd, config["daemon_pid"], settings, watch_fd)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        # No waiting for the middle process (SIGCHLD is ignored: the kernel reaps it):
        # the next request is forked while this one's children are still being made.


def main() -> None:
    fd, raw_config = int(sys.argv[1]), sys.argv[2]
    config = json.loads(raw_config)
    sock = socket.socket(fileno=fd)
    # The daemon handles signals for everyone; a terminal's Ctrl-C must not kill us.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Middle processes are reaped by the kernel (see _serve); a job child resets this
    # (child.main), and a handler's own subprocesses are waited for as usual.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # Not dumpable (as the daemon): no job of the daemon's uid may open our descriptors
    # (the daemon's stdout and stderr, its log) through /proc; the children inherit it
    # and a child of the daemon's uid sets itself dumpable again once its watcher, which
    # keeps these descriptors, is forked (pgworkerd.worker.child.main).
    from pgworkerd.worker import identity

    identity.set_dumpable(False)
    try:
        import pgworkerd.worker.child  # noqa: F401  (preload what every child runs)
        from pgworkerd import typed

        for module in config["modules"]:
            # typed payloads' declarations worked out once, here: every child inherits them
            typed.prime(importlib.import_module(module))
        if config["settings"].get("tracing"):  # [tracing] enabled (pgworkerd.tracing)
            from pgworkerd import tracing

            tracing.prepare_fork_server(config["settings"]["tracing"])
    except BaseException as exc:
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        _report(sock, {"error": f"cannot import handler module: {detail}"})
        sys.exit(1)
    # Everything loaded so far is shared with every child: out of the collector's reach,
    # a child's collections never write to (and so copy) those pages (the gc.freeze
    # documentation's advice for a pre-fork server).
    gc.freeze()
    _report(sock, {"ready": True})
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _serve(sock, config)  # until the daemon closes the socket or dies


def _report(sock: socket.socket, message: dict[str, Any]) -> None:
    """Tell the daemon how start-up went; if it died meanwhile, exit quietly (its
    successor starts a fork server of its own)."""
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
    except (BrokenPipeError, ConnectionResetError):
        sys.exit(0)


if __name__ == "__main__":
    main()

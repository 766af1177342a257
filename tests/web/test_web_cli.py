"""`pgworkerd web` as operators run it: a real process serving the dashboard, its refusal
of a public address without a login, and `hash-password` reading stdin."""

from __future__ import annotations

import contextlib
import http.client
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from daemon_harness import DEADLINE, PGWORKERD, wait_for
from dashboard_harness import PASSWORD_HASH, Http

from pgworkerd.exitcodes import ExitCode
from pgworkerd.web.passwords import verify


def hash_password(stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PGWORKERD), "web", "hash-password"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_hash_password_reads_stdin() -> None:
    done = hash_password("s3cret password\n")
    assert done.returncode == 0, done.stderr
    assert verify("s3cret password", done.stdout.strip())
    short = hash_password("short\n")
    assert short.returncode == ExitCode.CONFIG and "at least 8" in short.stderr
    assert "short" not in short.stderr.replace("at least", "")


def test_a_public_address_without_users_is_refused(test_db_dsn: str, schema: str) -> None:
    done = subprocess.run(
        [str(PGWORKERD), "--dsn", test_db_dsn, "--schema", schema, "web", "--bind", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == ExitCode.CONFIG
    assert "refusing to listen on '0.0.0.0' without a login" in done.stderr


def test_without_users_the_dashboard_does_not_start(test_db_dsn: str, schema: str) -> None:
    done = subprocess.run(
        [str(PGWORKERD), "--dsn", test_db_dsn, "--schema", schema, "web", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == ExitCode.CONFIG
    assert "refusing to serve without a login" in done.stderr and "--no-login" in done.stderr


def test_no_login_is_explicit_and_loud(test_db_dsn: str, schema: str) -> None:
    """--no-login serves, and says so in its log, its process title and every page."""
    proc = subprocess.Popen(
        [
            str(PGWORKERD),
            "--dsn",
            test_db_dsn,
            "--schema",
            schema,
            "web",
            "--port",
            "0",
            "--no-login",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert "WITHOUT A LOGIN" in proc.stderr.readline()
        line = proc.stderr.readline()
        found = re.search(r"serving http://127\.0\.0\.1:(\d+)/, NO LOGIN \(loopback only\)", line)
        assert found, line
        with open(f"/proc/{proc.pid}/cmdline", "rb") as title:
            assert b"NO LOGIN" in title.read()
        client = Http(int(found[1]))
        reply = wait_for(lambda: client.get("/"), what="the overview")
        assert reply.status == 200 and 'id="daemons"' in reply.body
        assert 'id="no-login"' in reply.body and "NO LOGIN" in reply.body
        # a proxy on this host would publish it (its requests come from 127.0.0.1): refused
        forwarded = client.get("/", headers={"X-Forwarded-For": "203.0.113.9"})
        assert forwarded.status == 403 and "proxy" in forwarded.body
        assert client.get("/", headers={"Forwarded": "for=203.0.113.9"}).status == 403
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        proc.kill()
        proc.wait()


def test_readable_user_hashes_are_warned_about_at_startup(
    test_db_dsn: str, schema: str, tmp_path: Path
) -> None:
    config = tmp_path / "web.toml"
    config.write_text(f'[web.users]\nalice = "{PASSWORD_HASH}"\n')
    config.chmod(0o644)
    proc = subprocess.Popen(
        [
            *(str(PGWORKERD), "--config", str(config), "--dsn", test_db_dsn),
            *("--schema", schema, "web", "--port", "0"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(2)]
        assert "holds [web.users] password hashes and is readable by others" in lines[0]
        assert "serving http://127.0.0.1:" in lines[1] and "login required" in lines[1]
        assert "scrypt$" not in "".join(lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        proc.kill()
        proc.wait()


class Served:
    """`pgworkerd web --port 0` in a process of its own; its stderr read to the end by a
    thread (an unread pipe that fills would block the server in a write)."""

    def __init__(self, dsn: str, schema: str, *, sigint_ignored: bool = False) -> None:
        def ignore_sigint() -> None:  # what a shell's `&` or nohup-like launchers do
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        self.proc = subprocess.Popen(
            [
                *(str(PGWORKERD), "--dsn", dsn, "--schema", schema),
                *("web", "--port", "0", "--no-login"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ignore_sigint if sigint_ignored else None,
        )
        assert self.proc.stderr is not None
        self.stderr = [self.proc.stderr.readline(), self.proc.stderr.readline()]
        line = self.stderr[-1]  # after the no-login warning
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        found = re.search(r"serving http://127\.0\.0\.1:(\d+)/, NO LOGIN \(loopback only\)", line)
        assert found, self.stderr
        self.client = Http(int(found[1]))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def stop(self, signum: int) -> float:
        """Send the signal; returns how long the server took to exit (exit status 0)."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=DEADLINE)
        took = time.monotonic() - sent
        self.reader.join(timeout=DEADLINE)
        assert code == 0, "".join(self.stderr)
        return took

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_the_command_serves_the_dashboard_until_stopped(test_db_dsn: str, schema: str) -> None:
    served = Served(test_db_dsn, schema)
    try:
        reply = wait_for(lambda: served.client.get("/"), what="the overview")
        assert reply.status == 200 and 'id="daemons"' in reply.body
        served.stop(signal.SIGINT)
    finally:
        served.kill()


def test_sigint_stops_a_server_started_with_sigint_ignored(test_db_dsn: str, schema: str) -> None:
    """Python leaves SIGINT ignored when its parent ignored it (a shell's background
    job): with KeyboardInterrupt as the only way to stop, such a server never stopped.
    The cause of this file's flaky first test: in a test run started in the background
    (`tests/run &` from a script), every child inherits SIGINT ignored, and the server
    had not exited 30 s after SIGINT."""
    served = Served(test_db_dsn, schema, sigint_ignored=True)
    try:
        assert wait_for(lambda: served.client.get("/"), what="the overview").status == 200
        served.stop(signal.SIGINT)
    finally:
        served.kill()


def test_sigterm_stops_the_server_cleanly(test_db_dsn: str, schema: str) -> None:
    served = Served(test_db_dsn, schema)
    try:
        assert wait_for(lambda: served.client.get("/"), what="the overview").status == 200
        served.stop(signal.SIGTERM)  # exit status 0: closed, not killed by the signal
    finally:
        served.kill()


def hammer(client: Http, stop: threading.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, http.client.HTTPException):
            client.get("/")


def test_a_signal_amid_requests_stops_the_server_within_seconds(
    test_db_dsn: str, schema: str
) -> None:
    """The signal lands while the server is busy (pages being served on several
    connections): it still exits, within the bounds of its shutdown."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        served = Served(test_db_dsn, schema)
        stop = threading.Event()

        clients = [
            threading.Thread(target=hammer, args=(served.client, stop), daemon=True)
            for _ in range(4)
        ]
        try:
            assert served.client.get("/").status == 200
            for c in clients:
                c.start()
            time.sleep(1.0)
            took = served.stop(signum)
            # the shutdown's own bounds: loop, request threads, pool (5 s each), plus slack
            assert took < 20, took
        finally:
            stop.set()
            for c in clients:
                c.join(timeout=DEADLINE)
            served.kill()

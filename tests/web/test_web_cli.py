"""`pgworkerd web` as operators run it: a real process serving the dashboard, its refusal
of a public address without a login, and `hash-password` reading stdin."""

from __future__ import annotations

import re
import signal
import subprocess

from daemon_harness import DEADLINE, PGWORKERD, wait_for
from dashboard_harness import Http

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


def test_the_command_serves_the_dashboard_until_stopped(test_db_dsn: str, schema: str) -> None:
    proc = subprocess.Popen(
        [str(PGWORKERD), "--dsn", test_db_dsn, "--schema", schema, "web", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"serving http://127\.0\.0\.1:(\d+)/, no login \(loopback only\)", line)
        assert found, line
        client = Http(int(found[1]))
        reply = wait_for(lambda: client.get("/"), what="the overview")
        assert reply.status == 200 and 'id="daemons"' in reply.body
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        proc.kill()
        proc.wait()

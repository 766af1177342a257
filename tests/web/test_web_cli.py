"""`pgworkerd web` as operators run it: a real process serving the dashboard, its refusal
of a public address without a login, and `hash-password` reading stdin."""

from __future__ import annotations

import re
import signal
import subprocess
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

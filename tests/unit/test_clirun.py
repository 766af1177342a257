"""tests/support/clirun.py runs the commands in the test's process: it must say what the
real `pgworkerd` says, exit code, stdout and stderr alike (no database needed here)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import invoke

PGWORKERD = Path(sys.executable).with_name("pgworkerd")


def real(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGWORKERD_", "PG")) and k != "NOTIFY_SOCKET"
    }
    return subprocess.run(
        [str(PGWORKERD), *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text("[worker]\nslots = 0\n")
    return path


CASES = {
    "version": lambda tmp: ["--version"],
    "unknown command (usage, 2)": lambda tmp: ["nope"],
    "bad option value (usage, 2)": lambda tmp: ["enqueue", "h", "--priority", "x"],
    "config error (3)": lambda tmp: ["--config", str(tmp / "c.toml"), "check-config"],
    "unreachable database (4)": lambda tmp: [
        "--dsn",
        f"host=127.0.0.1 port={closed_port()} password=never-shown",
        "jobs",
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_in_process_says_what_the_real_command_says(
    case: str, bad_config: Path, tmp_path: Path
) -> None:
    args = CASES[case](tmp_path)
    expected = real(*args)
    got = invoke(*args)
    assert (got.returncode, got.stdout, got.stderr) == (
        expected.returncode,
        expected.stdout,
        expected.stderr,
    )
    assert expected.returncode == 0 or expected.stderr  # a case that says something


def test_an_escaping_exception_is_a_traceback_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, bad_config: Path
) -> None:
    """As Python ends a process on an uncaught exception, so that "no traceback" checks
    on in-process runs mean what they say."""

    def broken(ctx: object) -> None:  # a bug in the command: nothing catches it
        raise RuntimeError("escaped")

    monkeypatch.setattr("pgworkerd.cli.Context.config", property(broken))
    got = invoke("--config", str(bad_config), "check-config")
    assert got.returncode == 1
    assert got.stderr.startswith("Traceback (most recent call last):")
    assert got.stderr.rstrip().endswith("RuntimeError: escaped")

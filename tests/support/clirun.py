"""The `pgworkerd` command run in the test's own process (click's CliRunner), for tests of
what a command prints, writes and exits with: a subprocess costs a Python start and the
imports (~0.5 s of CPU each, hundreds of runs in the suite); this costs milliseconds.

What the two ways share: the same click group (the console script calls it and nothing
else), argv, exit codes (`sys.exit` in `fail`, click's usage errors), stdout and stderr
apart, no stdin, no terminal, and the environment without the caller's PGWORKERD_*,
libpq PG* and NOTIFY_SOCKET. An exception the command lets out becomes what Python prints
for it, a traceback on stderr and exit 1, so that "no traceback" checks keep their meaning.

What needs the real process stays a subprocess (daemon_harness.PGWORKERD): the process
title and argv (password masking), signals, a command that runs until stopped (`run`,
`web`, `logs --follow`), and the bad-input matrix (tests/fault/test_bad_input.py)."""

from __future__ import annotations

import os
import subprocess
import traceback
from collections.abc import Mapping

from click.testing import CliRunner

from pgworkerd.cli import main

# What a subprocess of the tests is started without (see the module's docstring).
UNSET_PREFIXES = ("PGWORKERD_", "PG")


def _runner() -> CliRunner:
    try:  # click < 8.2 mixes stderr into stdout unless told not to
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg, unused-ignore]
    except TypeError:  # click >= 8.2: stderr is always kept apart
        return CliRunner()


def invoke(
    *args: str, env: Mapping[str, str] | None = None, clean: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `pgworkerd ARGS` in process; `env` is added to the environment, cleaned first
    unless `clean` is False (the environment as it is, as a subprocess would inherit it)."""
    cleared: dict[str, str | None] = {
        k: None
        for k in os.environ
        if clean and (k.startswith(UNSET_PREFIXES) or k == "NOTIFY_SOCKET")
    }
    result = _runner().invoke(
        main, list(args), env={**cleared, **(env or {})}, catch_exceptions=True
    )
    stderr = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
        code = 1
    return subprocess.CompletedProcess(["pgworkerd", *args], code, result.stdout, stderr)

"""The `pgworkerd` command run in the test's own process (click's CliRunner), for tests of
what a command prints, writes and exits with: a subprocess costs a Python start and the
imports (~0.5 s of CPU each, hundreds of runs in the suite); this costs milliseconds.

What the two ways share: the same click group (the console script calls it and nothing
else), argv, exit codes (`sys.exit` in `fail`, click's usage errors), stdout and stderr
apart, no stdin, no terminal, and the environment without the caller's PGWORKERD_*,
libpq PG* and NOTIFY_SOCKET. An exception the command lets out becomes what Python prints
for it, a traceback on stderr and exit 1, so that "no traceback" checks keep their meaning;
a warning logged with no handler set up goes to stderr as Python's last resort sends it
(pytest's log capture would otherwise take it).

What needs the real process stays a subprocess (daemon_harness.PGWORKERD): the process
title and argv (password masking), signals, a command that runs until stopped (`run`,
`web`, `logs --follow`), and the bad-input matrix (tests/fault/test_bad_input.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from click.testing import CliRunner

from pgworkerd.cli import main

# What a subprocess of the tests is started without (see the module's docstring).
UNSET_PREFIXES = ("PGWORKERD_", "PG")


def _runner() -> CliRunner:
    try:  # click < 8.2 mixes stderr into stdout unless told not to
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg, unused-ignore]
    except TypeError:  # click >= 8.2: stderr is always kept apart
        return CliRunner()


class _LastResort(logging.Handler):
    """logging.lastResort's behaviour: the bare message on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(self.format(record) + "\n")


@contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    logger = logging.getLogger("pgworkerd")
    if logger.handlers:  # set up by the test itself: leave it
        yield
        return
    handler = _LastResort(logging.WARNING)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


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
    with _warnings_to_stderr():
        result = _runner().invoke(
            main,
            list(args),
            env={**cleared, **(env or {})},
            catch_exceptions=True,
            prog_name="pgworkerd",  # as the console script names it in usage lines
        )
    stderr = result.stderr
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
        code = 1
    return subprocess.CompletedProcess(["pgworkerd", *args], code, result.stdout, stderr)

"""Exit codes of every pgworkerd command (docs/reference/exit-codes.md, held to it by a test)."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1  # the command ran and found a failure (e.g. drain --timeout expired)
    USAGE = 2  # bad command line (click's own code)
    CONFIG = 3  # invalid configuration file or bad input value
    DATABASE = 4  # database unreachable or refused us
    SCHEMA = 5  # schema missing, older or newer than this version
    HANDLER = 6  # a configured handler cannot be imported
    # The daemon exits with these only when restarting cannot help (systemd's
    # RestartPreventExitStatus lists them), so a broken config never crash-loops.


# The codes the units list in RestartPreventExitStatus=
# (tests/acceptance/test_systemd.py checks it).
RESTART_PREVENTING = (ExitCode.USAGE, ExitCode.CONFIG, ExitCode.SCHEMA, ExitCode.HANDLER)

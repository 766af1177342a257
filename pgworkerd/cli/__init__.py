"""The `pgworkerd` command line: the click group, its shared options (`Context`), and
what every command uses to fail and to reach the database. The commands are in
`jobs` (enqueue, cancel, retry, prune, jobs, show), `fleet` (status, drain, resume, pause),
`daemon` (run, migrate, check-config, files, demo), `schedules` (schedules), `logs`
(logs) and `web` (the dashboard). Exit codes: pgworkerd.exitcodes."""

from __future__ import annotations

# First of all: masks a --dsn password in the process title (`ps` shows argv to everyone).
import pgworkerd.earlytitle  # noqa: F401

# isort: split
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click
import psycopg

from pgworkerd.cli.display import printable, register_safe_loaders
from pgworkerd.config import Config, ConfigError
from pgworkerd.exitcodes import ExitCode
from pgworkerd.names import DEFAULT_SCHEMA, check_schema_name
from pgworkerd.queue.db import DatabaseError, InvalidDsn, connect, scrub
from pgworkerd.queue.migrate import SchemaError, check_current
from pgworkerd.version import __version__


class Context:
    """Options shared by every command."""

    def __init__(self, dsn: str | None, schema: str, config_path: str | None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.config_path = config_path

    def resolved_dsn(self) -> str:
        """--dsn, else the config file's database.dsn, else libpq's environment (PGHOST…)."""
        if self.dsn is not None:
            return self.dsn
        if self.config_path:
            return self.config().database.dsn
        return ""

    def config(self) -> Config:
        """The --config file's settings (the defaults without one); a bad file exits 3."""
        from pgworkerd.config import load_config

        if not self.config_path:
            return Config()
        try:
            return load_config(self.config_path)
        except ConfigError as exc:
            fail(str(exc), ExitCode.CONFIG)


def journal_priority(level: str) -> str:
    """sd-daemon's priority prefix when stderr is the journal (see pgworkerd.ops.logs)."""
    from pgworkerd.ops.logs import under_journald

    return level if under_journald(sys.stderr) else ""


def fail(message: str, code: ExitCode) -> NoReturn:
    # One inert line: messages quote DSNs, names and server text that others may have
    # written, so line breaks become "; " and other control characters are escaped.
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    click.echo(f"{journal_priority('<3>')}pgworkerd: {printable('; '.join(lines))}", err=True)
    sys.exit(int(code))


ROLES_SQL = "deploy/roles.sql, `pgworkerd files roles.sql`"
PEOPLE_ROLES = ("pgworkerd_reader", "pgworkerd_operator", "pgworkerd_enqueuer")

# What a command `needs` (database()'s argument) -> the roles of roles.sql that have that
# right, named in the one-line permission error so it sends the reader to a role that
# works (the daemon's role is left out: it is for `run`). Every `needs` must be here;
# tests/integration/test_people_roles.py runs each command as each role named.
ROLES_WITH_RIGHT: dict[str, tuple[str, ...]] = {
    "read the schema version": PEOPLE_ROLES,
    "read jobs": ("pgworkerd_reader", "pgworkerd_operator"),
    "read schedules": ("pgworkerd_reader", "pgworkerd_operator"),
    "declare schedules": ("pgworkerd_operator",),
    "enqueue jobs": ("pgworkerd_enqueuer", "pgworkerd_operator"),
    "change jobs": ("pgworkerd_operator",),
    "delete jobs": ("pgworkerd_operator",),
    "change the daemons' registry": ("pgworkerd_operator",),
    "pause queues and handlers": ("pgworkerd_operator",),
    "set handlers' defaults": ("pgworkerd_operator",),
    "read handlers' defaults": ("pgworkerd_reader", "pgworkerd_operator"),
    # durable waits: an enqueuer signals the jobs its login enqueued, the operator any
    "signal jobs": ("pgworkerd_enqueuer", "pgworkerd_operator"),
    "create or upgrade the schema": (),  # the schema's owner only
}


def roles_hint(needs: str) -> str:
    """The parenthesis of a permission error: who has the right, and where it is granted."""
    roles = ROLES_WITH_RIGHT.get(needs)
    if roles is None:  # a `needs` missing from the table (a test keeps it complete)
        return f"grants: {ROLES_SQL}"
    if not roles:
        return "only the schema's owner may, none of the roles of roles.sql"
    return f"roles.sql grants this to {', '.join(roles)}: {ROLES_SQL}"


@contextmanager
def database(
    ctx: Context, *, check_schema: bool = True, needs: str = "read jobs"
) -> Iterator[psycopg.Connection]:
    """A connection for one command; user errors become messages and exit codes.

    `needs` says what the command does with the database, for the one-line error a role
    without that right gets (e.g. the enqueuer role running `jobs`).
    """
    dsn = ""
    role = "?"
    doing = "read the schema version"
    try:
        dsn = ctx.resolved_dsn()
        with connect(dsn) as conn:
            # Rows are written by others: show what Python cannot load instead of dying.
            register_safe_loaders(conn)
            role = conn.info.user
            if check_schema:
                check_current(conn, ctx.schema)
            doing = needs
            yield conn
    except InvalidDsn as exc:
        fail(str(exc), ExitCode.CONFIG)
    except DatabaseError as exc:
        fail(str(exc), ExitCode.DATABASE)
    except SchemaError as exc:
        fail(str(exc), ExitCode.SCHEMA)
    except psycopg.errors.InsufficientPrivilege as exc:
        said = exc.diag.message_primary or ""
        if said.startswith("pgworkerd: "):  # ours, not a grant missing: an enqueue bound
            fail(scrub(said.removeprefix("pgworkerd: "), dsn), ExitCode.DATABASE)
        fail(
            f"permission denied: role {role!r} cannot {doing} ({roles_hint(doing)})",
            ExitCode.DATABASE,
        )
    except psycopg.errors.InvalidParameterValue as exc:
        fail(scrub(exc.diag.message_primary or str(exc), dsn), ExitCode.CONFIG)
    except psycopg.OperationalError as exc:
        fail(f"database error: {scrub(str(exc).strip(), dsn)}", ExitCode.DATABASE)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--dsn",
    envvar="PGWORKERD_DSN",
    help="libpq connection string or URL "
    "[env PGWORKERD_DSN; default: the config file's, else libpq's PG* variables]",
)
@click.option(
    "--schema",
    envvar="PGWORKERD_SCHEMA",
    default=DEFAULT_SCHEMA,
    show_default=True,
    help="PostgreSQL schema holding pgworkerd's tables [env PGWORKERD_SCHEMA]",
)
@click.option(
    "-c",
    "--config",
    "config_path",
    envvar="PGWORKERD_CONFIG",
    type=click.Path(dir_okay=False),
    help="TOML config file [env PGWORKERD_CONFIG]",
)
@click.version_option(version=__version__, prog_name="pgworkerd")
@click.pass_context
def main(click_ctx: click.Context, dsn: str | None, schema: str, config_path: str | None) -> None:
    """pgworkerd: runs long background jobs stored in PostgreSQL."""
    try:
        check_schema_name(schema)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--schema") from None
    click_ctx.obj = Context(dsn, schema, config_path)


# The commands register themselves on `main` when their modules load.
from pgworkerd.cli import daemon, fleet, jobs  # noqa: E402, F401

# isort: split
from pgworkerd.cli import logs, schedules  # noqa: E402, F401  (job output, periodic jobs)

# isort: split
from pgworkerd.cli import web  # noqa: E402, F401  (the dashboard)

# isort: split
from pgworkerd.cli import signals  # noqa: E402, F401  (durable waits)

# isort: split
from pgworkerd.cli import payloads  # noqa: E402, F401  (typed payloads' JSON Schemas)

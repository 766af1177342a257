"""Commands that run or set up a daemon: run, migrate, check-config, files, demo."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import click

from pgworkerd.cli import Context, database, fail, journal_priority, main
from pgworkerd.cli.display import echo_json, printable
from pgworkerd.cli.params import DURATION
from pgworkerd.config import ConfigError
from pgworkerd.exitcodes import ExitCode
from pgworkerd.names import DEFAULT_SCHEMA
from pgworkerd.queue.db import InvalidDsn, conninfo
from pgworkerd.queue.migrate import migrate_conn


@main.command()
@click.pass_obj
def migrate(ctx: Context) -> None:
    """Create or upgrade the schema (safe to run from several hosts at once)."""
    with database(ctx, check_schema=False, needs="create or upgrade the schema") as conn:
        applied = migrate_conn(conn, ctx.schema)
    if applied:
        click.echo(f"schema {ctx.schema}: applied migrations {', '.join(map(str, applied))}")
    else:
        click.echo(f"schema {ctx.schema}: up to date")


# Shipped in the package (pgworkerd/files/), so a pip-only user has them too.
SHIPPED_FILES = {
    "config.example.toml": "every config key with its default (for /etc/pgworkerd/)",
    # Drop-ins for the daemon's units (pgworkerd.service.d/): each lifts one part of the
    # sandbox that its jobs inherit, and says in its comment which failure it fixes.
    "dropin-gpu.conf": "systemd drop-in: jobs may use NVIDIA GPUs (DeviceAllow=)",
    "dropin-jit.conf": "systemd drop-in: jobs may run JIT compilers (MemoryDenyWriteExecute=no)",
    "dropin-job-cgroups.conf": "systemd drop-in: one cgroup per attempt ([worker] job_cgroups)",
    "dropin-job-uids.conf": "systemd drop-in: jobs as uids of their own ([worker] job_uids)",
    "dropin-output-dirs.conf": "systemd drop-in: directories jobs may write (ReadWritePaths=)",
    "dropin-venv.conf": "systemd drop-in: run pgworkerd from a virtualenv (ExecStart=)",
    "pgworkerd-web.service": "systemd unit: the web dashboard, `pgworkerd web`",
    "pgworkerd.service": "systemd unit: one daemon per host (/etc/systemd/system/)",
    "pgworkerd@.service": "systemd template: one daemon per /etc/pgworkerd/INSTANCE.toml",
    "roles.sql": "least-privilege roles: daemon, enqueuer, operator, reader (psql -f)",
}


@main.command("files")
@click.argument("names", nargs=-1)
@click.option(
    "--to",
    "directory",
    type=click.Path(file_okay=False),
    help="copy the files (default: all) into this directory; never overwrites",
)
def shipped_files(names: tuple[str, ...], directory: str | None) -> None:
    """List the config example, systemd units and roles.sql shipped with pgworkerd;
    print one (`pgworkerd files roles.sql`) or copy them (--to DIR)."""
    from importlib.resources import files as package_files

    unknown = [n for n in names if n not in SHIPPED_FILES]
    if unknown:
        raise click.UsageError(
            f"no shipped file '{printable(unknown[0])}': choose from {', '.join(SHIPPED_FILES)}"
        )
    source = package_files("pgworkerd") / "files"
    if directory is None:
        if not names:
            width = max(map(len, SHIPPED_FILES))
            for name, what in SHIPPED_FILES.items():
                click.echo(f"{name:<{width}} {what}")
            return
        if len(names) > 1:
            raise click.UsageError("give one file to print, or --to DIR to copy several")
        click.echo((source / names[0]).read_text(encoding="utf-8"), nl=False)
        return
    chosen = names or tuple(SHIPPED_FILES)
    target = os.path.abspath(directory)
    existing = [n for n in chosen if os.path.lexists(os.path.join(target, n))]
    if existing:  # an operator's edited copy is never replaced
        fail(
            f"{os.path.join(target, existing[0])} already exists; nothing copied", ExitCode.FAILURE
        )
    try:
        os.makedirs(target, exist_ok=True)
        for name in chosen:
            with open(os.path.join(target, name), "xb") as out:
                out.write((source / name).read_bytes())
    except OSError as exc:
        fail(f"cannot copy into {target}: {exc.strerror or exc}", ExitCode.FAILURE)
    click.echo(f"copied {', '.join(chosen)} into {target}")


@main.command("check-config")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.option(
    "-q", "--quiet", is_flag=True, help="print only errors and warnings (e.g. for ExecReload=)"
)
@click.pass_obj
def check_config(ctx: Context, as_json: bool, quiet: bool) -> None:
    """Validate the config, import every handler, print the effective config (every
    table, secrets masked)."""
    from pgworkerd.config import effective, file_warnings, import_handler
    from pgworkerd.config.show import effective_text

    if not ctx.config_path:
        raise click.UsageError("give the config file with --config (or PGWORKERD_CONFIG)")
    config = ctx.config()
    for warning in file_warnings(config):
        click.echo(f"{journal_priority('<4>')}WARNING: {warning}", err=True)
    for key in ("dsn", "listen_dsn"):
        value = getattr(config.database, key)
        if value:  # what `run` would refuse (exit 3), refused here too
            try:
                conninfo(value)
            except InvalidDsn as exc:
                fail(f"{config.path}: database.{key}: {exc}", ExitCode.CONFIG)
    for handler in config.handlers.values():
        try:
            import_handler(handler)
        except ConfigError as exc:
            fail(str(exc), ExitCode.HANDLER)
    if quiet:
        return
    data = effective(config)
    if as_json:
        echo_json(data)
        return
    click.echo(f"{config.path}: OK ({len(config.handlers)} handler(s))")
    for line in effective_text(config):
        click.echo(line)


@main.command()
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="log lines as text or JSON (default: the config's [logging] format)",
)
@click.pass_obj
def run(ctx: Context, log_format: str | None) -> None:
    """Run the daemon. Without a DSN (--dsn, PGWORKERD_DSN, database.dsn) it connects
    with libpq's defaults and PG* variables, like psql; `pgworkerd demo` runs the demo."""
    from pgworkerd.config import file_warnings, import_handler
    from pgworkerd.daemon.loop import run_daemon
    from pgworkerd.ops import logs

    config = ctx.config()
    logs.setup(log_format or config.logging.format, config.logging.level, config.logging.job_events)
    dsns = (ctx.dsn if ctx.dsn is not None else config.database.dsn, config.database.listen_dsn)
    logs.hide_passwords_of(*dsns)
    for warning in file_warnings(config):
        logging.getLogger("pgworkerd").warning("%s", warning)
    if not config.handlers:
        logging.getLogger("pgworkerd").warning(
            "no handlers configured%s: this daemon claims no jobs until a reload adds some",
            "" if ctx.config_path else " (no --config or PGWORKERD_CONFIG given)",
        )
    for dsn in dsns:
        try:
            conninfo(dsn)  # syntax only; retrying could never fix an unparsable DSN
        except InvalidDsn as exc:
            fail(str(exc), ExitCode.CONFIG)
    if config.worker.job_uids is not None:
        from pgworkerd.daemon.jobuids import claim_range, startup_problem

        problem = startup_problem(ctx.config_path, config.worker.job_uids) or claim_range(
            config.worker.job_uids
        )
        if problem:
            fail(f"{config.path}: worker.job_uids: {problem}", ExitCode.CONFIG)
    for handler in config.handlers.values():
        try:
            import_handler(handler)
        except ConfigError as exc:
            fail(str(exc), ExitCode.HANDLER)
    from pgworkerd.daemon.cgroups import NoDelegation, setup

    try:
        job_cgroups = setup(config.worker.job_cgroups)
    except NoDelegation as exc:
        fail(f'{config.path}: worker.job_cgroups = "require": {exc}', ExitCode.CONFIG)
    schema = ctx.schema if ctx.schema != DEFAULT_SCHEMA else None
    sys.exit(
        run_daemon(
            config,
            dsn=ctx.dsn,
            schema=schema,
            config_path=ctx.config_path,
            job_cgroups=job_cgroups,
        )
    )


@main.command()
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--seconds", type=DURATION, help="drain and stop after this long")
def demo(log_format: str, seconds: float | None) -> None:
    """Start a throwaway PostgreSQL, enqueue example jobs and run the daemon on them.
    Ctrl-C drains, stops and removes the database."""
    from pgworkerd.ops import logs

    logs.setup(log_format, "info")
    _run_demo(log_format, seconds)


def _run_demo(log_format: str, seconds: float | None) -> NoReturn:
    from pgworkerd.devcluster.demo import run_demo

    try:
        code = run_demo(log_format, seconds=seconds)
    except OSError as exc:  # e.g. /tmp read-only or full: no room for the throwaway cluster
        fail(f"cannot start a local PostgreSQL for the demo: {exc}", ExitCode.DATABASE)
    sys.exit(code)

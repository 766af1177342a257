"""The `pgworkerd` command line. Exit codes: pgworkerd.exitcodes.ExitCode."""

from __future__ import annotations

# First of all: masks a --dsn password in the process title (`ps` shows argv to everyone).
import pgworkerd.earlytitle  # noqa: F401

# isort: split
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import click
import psycopg

from pgworkerd import client
from pgworkerd.cli.display import RawJson, printable, register_safe_loaders
from pgworkerd.config import Config, ConfigError
from pgworkerd.durations import parse_duration
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import admin, model
from pgworkerd.queue.db import DatabaseError, InvalidDsn, connect, conninfo, scrub
from pgworkerd.queue.migrate import SchemaError, check_current, migrate_conn
from pgworkerd.queue.queries import DEFAULT_SCHEMA, check_schema_name


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
            return _load(self).database.dsn
        return ""


def _priority(level: str) -> str:
    """sd-daemon's priority prefix when stderr is the journal (see pgworkerd.ops.logs)."""
    from pgworkerd.ops.logs import under_journald

    return level if under_journald(sys.stderr) else ""


def fail(message: str, code: ExitCode) -> NoReturn:
    # One inert line: messages quote DSNs, names and server text that others may have
    # written, so line breaks become "; " and other control characters are escaped.
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    click.echo(f"{_priority('<3>')}pgworkerd: {printable('; '.join(lines))}", err=True)
    sys.exit(int(code))


ROLES_HINT = "grants: deploy/roles.sql, `pgworkerd files roles.sql`"


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
    except psycopg.errors.InsufficientPrivilege:
        fail(f"permission denied: role {role!r} cannot {doing} ({ROLES_HINT})", ExitCode.DATABASE)
    except psycopg.errors.InvalidParameterValue as exc:
        fail(scrub(exc.diag.message_primary or str(exc), dsn), ExitCode.CONFIG)
    except psycopg.OperationalError as exc:
        fail(f"database error: {scrub(str(exc).strip(), dsn)}", ExitCode.DATABASE)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, sort_keys=True))


class DurationType(click.ParamType):
    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()


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
@click.version_option(package_name="pgworkerd")
@click.pass_context
def main(click_ctx: click.Context, dsn: str | None, schema: str, config_path: str | None) -> None:
    """pgworkerd: runs long background jobs stored in PostgreSQL."""
    try:
        check_schema_name(schema)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--schema") from None
    click_ctx.obj = Context(dsn, schema, config_path)


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


def _parse_payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from None
    if not isinstance(payload, dict):
        raise click.BadParameter(
            f"must be a JSON object, not {client.json_type_name(payload)}", param_hint="--payload"
        )
    return payload


@main.command()
@click.argument("handler")
@click.option("--payload", default="{}", show_default=True, help="JSON object for the handler")
@click.option("--queue", default=client.DEFAULT_QUEUE, show_default=True)
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    help="lower runs sooner; negative is urgent",
)
@click.option(
    "--run-at",
    type=click.DateTime(
        ["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
    ),
    help="when to run (ISO 8601; local time if no offset)",
)
@click.option("--delay", type=DURATION, help="run after this long, e.g. 30s, 10m")
@click.option("--max-attempts", type=int, default=client.DEFAULT_MAX_ATTEMPTS, show_default=True)
@click.option(
    "--dedupe-key",
    help="while a job with this key is pending or running, return its id instead of adding another",
)
@click.pass_obj
def enqueue(
    ctx: Context,
    handler: str,
    payload: str,
    queue: str,
    priority: int,
    run_at: datetime | None,
    delay: float | None,
    max_attempts: int,
    dedupe_key: str | None,
) -> None:
    """Enqueue a job for HANDLER and print its id."""
    if run_at is not None and delay is not None:
        raise click.UsageError("give --run-at or --delay, not both")
    if run_at is not None and run_at.tzinfo is None:
        run_at = run_at.astimezone()
    spec = client.JobSpec(
        handler, _parse_payload(payload), queue, priority, run_at, delay, max_attempts, dedupe_key
    )
    try:
        spec.as_json()
    except client.InvalidJob as exc:
        fail(str(exc), ExitCode.CONFIG)
    with database(ctx, needs="enqueue jobs") as conn:
        [job_id] = client.enqueue_many(conn, [spec], schema=ctx.schema)
    click.echo(job_id)


@main.command()
@click.argument("ids", nargs=-1, type=int, required=True)
@click.pass_obj
def cancel(ctx: Context, ids: tuple[int, ...]) -> None:
    """Cancel jobs: pending ones at once, running ones by asking their daemon."""
    with database(ctx, needs="change jobs") as conn:
        outcomes = admin.cancel(conn, ids, schema=ctx.schema)
    for job_id in ids:
        click.echo(f"{job_id}: {printable(outcomes[job_id])}")
    # Cancelling a cancelled job again is fine (it is as asked); an unknown one, or one
    # that completed or died before the cancel, was not cancelled.
    done = ("cancelled", "cancel requested", "already cancelled")
    if any(outcomes[i] not in done for i in ids):
        sys.exit(int(ExitCode.FAILURE))


@main.command()
@click.argument("ids", nargs=-1, type=int)
@click.option("--queue", help="every dead or cancelled job of this queue")
@click.option("--handler", help="every dead or cancelled job of this handler")
@click.pass_obj
def retry(ctx: Context, ids: tuple[int, ...], queue: str | None, handler: str | None) -> None:
    """Put dead or cancelled jobs back to pending with fresh attempts."""
    if not ids and queue is None and handler is None:
        raise click.UsageError("give job ids, --queue or --handler")
    with database(ctx, needs="change jobs") as conn:
        retried = admin.retry(
            conn, ids=list(ids) or None, queue=queue, handler=handler, schema=ctx.schema
        )
        # Ids given but not retried: say why, one line each, and exit 1 (as cancel does).
        left = [i for i in dict.fromkeys(ids) if i not in set(retried)]
        why = {i: _not_retried(admin.get(conn, i, schema=ctx.schema)) for i in left}
    click.echo(
        f"retried {len(retried)} job(s)"
        + (f": {', '.join(map(str, retried))}" if 0 < len(retried) <= 50 else "")
    )
    for job_id, reason in why.items():
        click.echo(f"{job_id}: {reason}")
    if why:
        sys.exit(int(ExitCode.FAILURE))


def _not_retried(row: dict[str, Any] | None) -> str:
    if row is None:
        return "not found"
    if row["status"] in ("dead", "cancelled") and row["dedupe_key"] is not None:
        # job_retry leaves a job whose dedupe key a live job (or a newer one) holds
        return f"not retried: another job holds its dedupe key '{printable(row['dedupe_key'])}'"
    if row["status"] in ("dead", "cancelled"):
        return "not retried: it changed meanwhile, try again"
    return f"not retried: it is {row['status']} (only dead or cancelled jobs are)"


@main.command()
@click.option(
    "--older-than",
    type=DURATION,
    required=True,
    help="retention: delete jobs finished longer ago than this, e.g. 7d",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(list(model.FINAL_STATUSES)),
    help="only these final statuses (repeatable; default all three)",
)
@click.pass_obj
def prune(ctx: Context, older_than: float, statuses: tuple[str, ...]) -> None:
    """Delete finished jobs older than a retention."""
    with database(ctx, needs="delete jobs") as conn:
        deleted = admin.prune(
            conn,
            timedelta(seconds=older_than),
            statuses=statuses or model.FINAL_STATUSES,
            schema=ctx.schema,
        )
    click.echo(f"deleted {deleted} job(s)")


@main.command("jobs")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(list(model.STATUSES)),
    help="repeatable",
)
@click.option("--queue")
@click.option("--handler")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def list_jobs(
    ctx: Context,
    statuses: tuple[str, ...],
    queue: str | None,
    handler: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    with database(ctx) as conn:
        rows = admin.list_jobs(
            conn,
            statuses=statuses or None,
            queue=queue,
            handler=handler,
            limit=limit,
            schema=ctx.schema,
        )
    if as_json:
        echo_json(rows)
        return
    click.echo(f"{'ID':>8} {'STATUS':<9} {'QUEUE':<12} {'HANDLER':<24} {'ATTEMPTS':<8}  ERROR")
    for r in rows:
        attempts = f"{r['attempts']}/{r['max_attempts']}"
        line = (
            f"{r['id']:>8} {r['status']:<9} {printable(r['queue']):<12} "
            f"{printable(r['handler']):<24} {attempts:<8}"
        )
        click.echo(f"{line}  {_error_summary(r)}".rstrip())


def _error_summary(row: dict[str, Any]) -> str:
    """The last line of a job's last error. The column is never cleared, so the error is
    marked as history unless it is why the job is where it is: dead, cancelled, or
    pending for a retry (a job retried by hand starts again at attempt 0)."""
    lines = (row["last_error"] or "").strip().split("\n")
    last = printable(lines[-1].strip())[:80]
    if not last:
        return ""
    current = row["status"] in ("dead", "cancelled") or (
        row["status"] == "pending" and row["attempts"] > 0
    )
    return last if current else f"(earlier attempt: {last})"


@main.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def show_job(ctx: Context, job_id: int, as_json: bool) -> None:
    """Show one job with every column, its last error and traceback."""
    with database(ctx) as conn:
        row = admin.get(conn, job_id, schema=ctx.schema)
    if row is None:
        fail(f"job {job_id} not found", ExitCode.FAILURE)
    if as_json:
        echo_json(row)
        return
    for key, value in row.items():
        if key == "last_error" and value:
            # a traceback reads best on its own lines; each is escaped and indented, so
            # nothing in it can pass for a field of its own
            lines = str(value).rstrip("\n").split("\n")
            click.echo("last_error:\n" + "\n".join(f"  {printable(ln)}" for ln in lines))
        elif isinstance(value, dict | list):
            click.echo(f"{key}: {json.dumps(value, default=str)}")
        elif isinstance(value, RawJson):  # JSON text Python could not load: shown as is
            click.echo(f"{key}: {printable(value)}")
        else:
            click.echo(f"{key}: {printable(value)}")


# Shipped in the package (pgworkerd/files/), so a pip-only user has them too.
SHIPPED_FILES = {
    "config.example.toml": "every config key with its default (for /etc/pgworkerd/)",
    "pgworkerd.service": "systemd unit: one daemon per host (/etc/systemd/system/)",
    "pgworkerd@.service": "systemd template: one daemon per /etc/pgworkerd/INSTANCE.toml",
    "roles.sql": "least-privilege roles pgworkerd_daemon and pgworkerd_enqueuer (psql -f)",
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
            for name, what in SHIPPED_FILES.items():
                click.echo(f"{name:<20} {what}")
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


def _load(ctx: Context) -> Config:
    from pgworkerd.config import load_config

    if not ctx.config_path:
        return Config()
    try:
        return load_config(ctx.config_path)
    except ConfigError as exc:
        fail(str(exc), ExitCode.CONFIG)


@main.command("check-config")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.option(
    "-q", "--quiet", is_flag=True, help="print only errors and warnings (e.g. for ExecReload=)"
)
@click.pass_obj
def check_config(ctx: Context, as_json: bool, quiet: bool) -> None:
    """Validate the config, import every handler, print the effective config."""
    from pgworkerd.config import effective, file_warnings, import_handler

    if not ctx.config_path:
        raise click.UsageError("give the config file with --config (or PGWORKERD_CONFIG)")
    config = _load(ctx)
    for warning in file_warnings(config):
        click.echo(f"{_priority('<4>')}WARNING: {warning}", err=True)
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
    for table in ("database", "worker", "logging", "metrics"):
        click.echo(f"[{table}]")
        for key, value in data[table].items():
            click.echo(f"{key} = {json.dumps(value)}")
    for name, handler in data["handlers"].items():
        click.echo(f"[handlers.{name}]")
        for key, value in handler.items():
            if key != "name" and value is not None:
                click.echo(f"{key} = {json.dumps(value)}")


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

    config = _load(ctx)
    logs.setup(log_format or config.logging.format, config.logging.level)
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
    for handler in config.handlers.values():
        try:
            import_handler(handler)
        except ConfigError as exc:
            fail(str(exc), ExitCode.HANDLER)
    schema = ctx.schema if ctx.schema != DEFAULT_SCHEMA else None
    sys.exit(run_daemon(config, dsn=ctx.dsn, schema=schema, config_path=ctx.config_path))


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


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def status(ctx: Context, as_json: bool) -> None:
    """Daemons, running jobs, counts per queue, and jobs no daemon serves.

    Exit code 0; 1 when a drain is left in place or jobs wait for a handler nobody serves.
    """
    from pgworkerd.queue import fleet

    with database(ctx, needs="read jobs") as conn:
        snap = fleet.snapshot(conn, ctx.schema)
    live = [d for d in snap["daemons"] if d["state"] != "gone"]
    drained = [d for d in live if d["drain_requested"]]
    if as_json:
        echo_json(snap)
    else:
        for d in drained:
            click.secho(
                f"WARNING: daemon {printable(d['id'])} on {printable(d['host'])} is DRAINED "
                "and takes no jobs; "
                f"`pgworkerd resume --worker {printable(d['id'])}` (or --all) undoes it",
                fg="red",
                bold=True,
                err=True,
            )
        click.echo(f"daemons ({len(live)} live):")
        for d in snap["daemons"]:
            click.echo(f"  {_daemon_line(d)}")
        click.echo(f"running jobs ({len(snap['running_jobs'])}):")
        for j in snap["running_jobs"]:
            progress = _progress(j["progress"])
            click.echo(
                f"  {j['id']:>8} {printable(j['handler']):<24} attempt {j['attempts']}/"
                f"{j['max_attempts']}  {_age(j['age_seconds'])}  on {printable(j['locked_by'])}"
                f"  {progress}".rstrip()
            )
        click.echo("jobs per queue:")
        for queue, by_status in sorted(snap["counts"].items()):
            parts = ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
            click.echo(f"  {printable(queue)}: {parts}")
        if snap["other_queues"]:
            parts = ", ".join(f"{s} {n}" for s, n in sorted(snap["other_queues"].items()))
            click.echo(f"  (all other queues): {parts}")
        click.echo(f"oldest due pending job: {_age(snap['oldest_pending_seconds'])}")
        for u in snap["unserved"]:
            click.secho(
                f"WARNING: {u['jobs']} pending job(s) of handler {u['handler']!r} on "
                f"queue {u['queue']!r} have no live daemon serving them (oldest "
                f"{_age(u['oldest_seconds'])})",
                fg="yellow",
                err=True,
            )
        more = (snap["unserved"][0]["groups"] - len(snap["unserved"])) if snap["unserved"] else 0
        if more > 0:
            click.secho(
                f"WARNING: and {more} more handler and queue pair(s) with unserved jobs",
                fg="yellow",
                err=True,
            )
    if drained or snap["unserved"]:
        sys.exit(int(ExitCode.FAILURE))


def _daemon_line(d: dict[str, Any]) -> str:
    head = f"{printable(d['id']):<32} {printable(d['host']):<16} pid {d['pid']:<7}"
    if d["state"] != "gone":
        return (
            f"{head} {printable(d['state']):<9} {d['busy']}/{d['slots']} busy  "
            f"up {_age(d['uptime_seconds'])}  heartbeat {_age(d['heartbeat_age_seconds'])} ago"
        )
    # Gone: a fixed point in time, not ages that keep growing after the daemon stopped.
    stopped = d["stopped_at"] or d["heartbeat_at"]
    ran = (
        _age((stopped - d["started_at"]).total_seconds())
        if isinstance(stopped, datetime) and isinstance(d["started_at"], datetime)
        else "-"
    )
    return f"{head} gone      since {_utc(stopped)} (ran {ran}, last busy {d['busy']}/{d['slots']})"


def _utc(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return printable(value)  # a timestamp Python cannot hold comes as the server's text


def _progress(value: Any) -> str:
    if value is None:
        return ""
    # json.dumps escapes control characters itself
    return printable(value) if isinstance(value, RawJson) else json.dumps(value)


def _drain_target(worker: str | None, all_hosts: bool) -> str:
    if worker and all_hosts:
        raise click.UsageError("give --worker or --all, not both")
    if worker:
        return f"daemon {printable(worker)}"
    return "all daemons" if all_hosts else "this host's daemons"


@main.command()
@click.option("--all", "all_hosts", is_flag=True, help="every daemon on every host")
@click.option("--worker", help="one daemon, by the id `status` shows")
@click.option("--wait", is_flag=True, help="wait until their running jobs have finished")
@click.option(
    "--timeout",
    type=DURATION,
    help="with --wait: give up after this long (exit 1, listing the jobs still running)",
)
@click.pass_obj
def drain(
    ctx: Context, all_hosts: bool, worker: str | None, wait: bool, timeout: float | None
) -> None:
    """Ask daemons to stop claiming jobs (they stay up until stopped or resumed).

    Exit code 0 when drained; 1 when --timeout expired; 4/5 for database/schema trouble.
    """
    import time

    from pgworkerd.queue import fleet, registry

    target = _drain_target(worker, all_hosts)
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    with database(ctx, needs="change the daemons' registry") as conn:
        affected = fleet.request_drain(
            conn, ctx.schema, drain=True, worker_id=worker, all_hosts=all_hosts
        )
        if not affected:
            fail(f"no live daemon matches ({target})", ExitCode.FAILURE)
        click.echo(
            f"drain requested for {len(affected)} daemon(s): "
            + ", ".join(printable(a["id"]) for a in affected)
        )
        if not wait:
            return
        ids = {a["id"] for a in affected}
        deadline = None if timeout is None else time.monotonic() + timeout
        last = ""
        while True:
            # A killed daemon never reports drained; with no other daemon left to notice,
            # waiting on it would never end. Silent this long, it is dead (its children
            # died with it) or cut off from the database (its jobs stop themselves by
            # the end of their leases); either way their leases bring the jobs back.
            for worker_id, host, pid in registry.mark_stale(
                conn, registry.STALE_AFTER_SECONDS, ctx.schema
            ):
                if worker_id in ids:
                    click.echo(
                        f"daemon {printable(worker_id)} (host {printable(host)} pid {pid})"
                        " has been silent for"
                        f" {registry.STALE_AFTER_SECONDS:.0f} s: marked gone (killed, or cut"
                        " off from the database: then its jobs stop by the end of their"
                        " leases); they go back to the queue when their leases expire"
                    )
            busy = fleet.daemons_still_busy(conn, ctx.schema, ids)
            if not busy:
                click.echo("drained: no jobs running on " + target)
                return
            jobs_left = sorted(j for d in busy for j in d["in_flight"])
            line = f"waiting for {len(busy)} daemon(s), {len(jobs_left)} job(s) running" + (
                f": {', '.join(map(str, jobs_left[:20]))}" if jobs_left else ""
            )
            if line != last:
                click.echo(line)
                last = line
            if deadline is not None and time.monotonic() >= deadline:
                click.echo(
                    f"timed out; still running: {', '.join(map(str, jobs_left)) or '-'}"
                    " (the drain stays requested; `pgworkerd resume` undoes it)",
                    err=True,
                )
                sys.exit(int(ExitCode.FAILURE))
            time.sleep(0.5)


@main.command()
@click.option("--all", "all_hosts", is_flag=True, help="every daemon on every host")
@click.option("--worker", help="one daemon, by the id `status` shows")
@click.pass_obj
def resume(ctx: Context, all_hosts: bool, worker: str | None) -> None:
    """Undo a drain: the daemons claim jobs again."""
    from pgworkerd.queue import fleet

    target = _drain_target(worker, all_hosts)
    with database(ctx, needs="change the daemons' registry") as conn:
        affected = fleet.request_drain(
            conn, ctx.schema, drain=False, worker_id=worker, all_hosts=all_hosts
        )
    if not affected:
        fail(f"no live daemon matches ({target})", ExitCode.FAILURE)
    click.echo(
        f"resumed {len(affected)} daemon(s): " + ", ".join(printable(a["id"]) for a in affected)
    )

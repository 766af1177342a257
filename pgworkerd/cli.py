"""The `pgworkerd` command line. Exit codes: pgworkerd.exitcodes.ExitCode."""

from __future__ import annotations

# First of all: masks a --dsn password in the process title (`ps` shows argv to everyone).
import pgworkerd.earlytitle  # noqa: F401

# isort: split
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, NoReturn

import click
import psycopg

from pgworkerd import jobs
from pgworkerd.config import Config, ConfigError
from pgworkerd.db import DatabaseError, InvalidDsn, connect, conninfo, scrub
from pgworkerd.durations import parse_duration
from pgworkerd.exitcodes import ExitCode
from pgworkerd.migrate import SchemaError, check_current, migrate_conn
from pgworkerd.queries import DEFAULT_SCHEMA, check_schema_name


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
    """sd-daemon's priority prefix when stderr is the journal (see pgworkerd.logs)."""
    from pgworkerd.logs import under_journald

    return level if under_journald(sys.stderr) else ""


def fail(message: str, code: ExitCode) -> NoReturn:
    click.echo(f"{_priority('<3>')}pgworkerd: {message}", err=True)
    sys.exit(int(code))


@contextmanager
def database(ctx: Context, *, check_schema: bool = True) -> Iterator[psycopg.Connection]:
    """A connection for one command; user errors become messages and exit codes."""
    dsn = ""
    try:
        dsn = ctx.resolved_dsn()
        with connect(dsn) as conn:
            if check_schema:
                check_current(conn, ctx.schema)
            yield conn
    except InvalidDsn as exc:
        fail(str(exc), ExitCode.CONFIG)
    except DatabaseError as exc:
        fail(str(exc), ExitCode.DATABASE)
    except SchemaError as exc:
        fail(str(exc), ExitCode.SCHEMA)
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
    with database(ctx, check_schema=False) as conn:
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
            f"must be a JSON object, not {type(payload).__name__}", param_hint="--payload"
        )
    return payload


@main.command()
@click.argument("handler")
@click.option("--payload", default="{}", show_default=True, help="JSON object for the handler")
@click.option("--queue", default=jobs.DEFAULT_QUEUE, show_default=True)
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
@click.option("--max-attempts", type=int, default=jobs.DEFAULT_MAX_ATTEMPTS, show_default=True)
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
    spec = jobs.JobSpec(
        handler, _parse_payload(payload), queue, priority, run_at, delay, max_attempts, dedupe_key
    )
    try:
        spec.as_json()
    except jobs.InvalidJob as exc:
        fail(str(exc), ExitCode.CONFIG)
    with database(ctx) as conn:
        [job_id] = jobs.enqueue_many(conn, [spec], schema=ctx.schema)
    click.echo(job_id)


@main.command()
@click.argument("ids", nargs=-1, type=int, required=True)
@click.pass_obj
def cancel(ctx: Context, ids: tuple[int, ...]) -> None:
    """Cancel jobs: pending ones at once, running ones by asking their daemon."""
    with database(ctx) as conn:
        outcomes = jobs.cancel(conn, ids, schema=ctx.schema)
    for job_id in ids:
        click.echo(f"{job_id}: {outcomes[job_id]}")
    if any(outcomes[i] == "not found" for i in ids):
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
    with database(ctx) as conn:
        retried = jobs.retry(
            conn, ids=list(ids) or None, queue=queue, handler=handler, schema=ctx.schema
        )
    click.echo(
        f"retried {len(retried)} job(s)"
        + (f": {', '.join(map(str, retried))}" if 0 < len(retried) <= 50 else "")
    )


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
    type=click.Choice(list(jobs.FINAL_STATUSES)),
    help="only these final statuses (repeatable; default all three)",
)
@click.pass_obj
def prune(ctx: Context, older_than: float, statuses: tuple[str, ...]) -> None:
    """Delete finished jobs older than a retention."""
    with database(ctx) as conn:
        deleted = jobs.prune(
            conn,
            timedelta(seconds=older_than),
            statuses=statuses or jobs.FINAL_STATUSES,
            schema=ctx.schema,
        )
    click.echo(f"deleted {deleted} job(s)")


@main.command("jobs")
@click.option(
    "--status", "statuses", multiple=True, type=click.Choice(list(jobs.STATUSES)), help="repeatable"
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
        rows = jobs.list_jobs(
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
    for r in rows:
        error = (r["last_error"] or "").strip().splitlines()
        click.echo(
            f"{r['id']:>8} {r['status']:<9} {r['queue']:<12} {r['handler']:<24} "
            f"attempt {r['attempts']}/{r['max_attempts']}"
            + (f"  {error[-1][:80]}" if error else "")
        )


@main.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def show_job(ctx: Context, job_id: int, as_json: bool) -> None:
    """Show one job with every column, its last error and traceback."""
    with database(ctx) as conn:
        row = jobs.get(conn, job_id, schema=ctx.schema)
    if row is None:
        fail(f"job {job_id} not found", ExitCode.FAILURE)
    if as_json:
        echo_json(row)
        return
    for key, value in row.items():
        if key == "last_error" and value:
            click.echo("last_error:\n  " + str(value).replace("\n", "\n  "))
        else:
            shown = json.dumps(value, default=str) if isinstance(value, dict | list) else value
            click.echo(f"{key}: {shown}")


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
    from pgworkerd import logs
    from pgworkerd.config import file_warnings, import_handler
    from pgworkerd.daemon import run_daemon

    config = _load(ctx)
    logs.setup(log_format or config.logging.format, config.logging.level)
    dsns = (ctx.dsn if ctx.dsn is not None else config.database.dsn, config.database.listen_dsn)
    logs.hide_passwords_of(*dsns)
    for warning in file_warnings(config):
        logging.getLogger("pgworkerd").warning("%s", warning)
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
    from pgworkerd import logs

    logs.setup(log_format, "info")
    _run_demo(log_format, seconds)


def _run_demo(log_format: str, seconds: float | None) -> NoReturn:
    from pgworkerd.demo import run_demo

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
    from pgworkerd import fleet

    with database(ctx) as conn:
        snap = fleet.snapshot(conn, ctx.schema)
    live = [d for d in snap["daemons"] if d["state"] != "gone"]
    drained = [d for d in live if d["drain_requested"]]
    if as_json:
        echo_json(snap)
    else:
        for d in drained:
            click.secho(
                f"WARNING: daemon {d['id']} on {d['host']} is DRAINED and takes no jobs; "
                f"`pgworkerd resume --worker {d['id']}` (or --all) undoes it",
                fg="red",
                bold=True,
                err=True,
            )
        click.echo(f"daemons ({len(live)} live):")
        for d in snap["daemons"]:
            click.echo(
                f"  {d['id']:<32} {d['host']:<16} pid {d['pid']:<7} {d['state']:<9} "
                f"{d['busy']}/{d['slots']} busy  up {_age(d['uptime_seconds'])}  "
                f"heartbeat {_age(d['heartbeat_age_seconds'])} ago"
            )
        click.echo(f"running jobs ({len(snap['running_jobs'])}):")
        for j in snap["running_jobs"]:
            progress = json.dumps(j["progress"]) if j["progress"] is not None else ""
            click.echo(
                f"  {j['id']:>8} {j['handler']:<24} attempt {j['attempts']}/"
                f"{j['max_attempts']}  {_age(j['age_seconds'])}  on {j['locked_by']}"
                f"  {progress}"
            )
        click.echo("jobs per queue:")
        for queue, by_status in sorted(snap["counts"].items()):
            parts = ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
            click.echo(f"  {queue}: {parts}")
        click.echo(f"oldest due pending job: {_age(snap['oldest_pending_seconds'])}")
        for u in snap["unserved"]:
            click.secho(
                f"WARNING: {u['jobs']} pending job(s) of handler {u['handler']!r} on "
                f"queue {u['queue']!r} have no live daemon serving them (oldest "
                f"{_age(u['oldest_seconds'])})",
                fg="yellow",
                err=True,
            )
    if drained or snap["unserved"]:
        sys.exit(int(ExitCode.FAILURE))


def _drain_target(worker: str | None, all_hosts: bool) -> str:
    if worker and all_hosts:
        raise click.UsageError("give --worker or --all, not both")
    return f"daemon {worker}" if worker else ("all daemons" if all_hosts else "this host's daemons")


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

    from pgworkerd import fleet, registry

    target = _drain_target(worker, all_hosts)
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    with database(ctx) as conn:
        affected = fleet.request_drain(
            conn, ctx.schema, drain=True, worker_id=worker, all_hosts=all_hosts
        )
        if not affected:
            fail(f"no live daemon matches ({target})", ExitCode.FAILURE)
        click.echo(
            f"drain requested for {len(affected)} daemon(s): "
            + ", ".join(a["id"] for a in affected)
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
                        f"daemon {worker_id} (host {host} pid {pid}) has been silent for"
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
    from pgworkerd import fleet

    target = _drain_target(worker, all_hosts)
    with database(ctx) as conn:
        affected = fleet.request_drain(
            conn, ctx.schema, drain=False, worker_id=worker, all_hosts=all_hosts
        )
    if not affected:
        fail(f"no live daemon matches ({target})", ExitCode.FAILURE)
    click.echo(f"resumed {len(affected)} daemon(s): " + ", ".join(a["id"] for a in affected))

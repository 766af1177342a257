"""`pgworkerd schedules`: the periodic jobs the database knows, their last and next run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from pgworkerd.cadence import Cadence
from pgworkerd.cli import Context, database, main
from pgworkerd.cli.display import echo_json, printable


def next_run(definition: Any, now: datetime) -> datetime | None:
    """The next tick of a stored definition (written by some daemon: checked here again;
    None when it cannot be read)."""
    try:
        return Cadence(definition).next_after(now)
    except Exception:  # a definition this version cannot read is shown, not fatal
        return None


def _when(definition: Any) -> str:
    if not isinstance(definition, dict):
        return "?"
    if definition.get("every"):
        return (
            f"every {definition['every']:g}s"
            if isinstance(definition["every"], int | float)
            else "?"
        )
    return f"cron {definition.get('cron')!s} {definition.get('timezone')!s}"


def _utc(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return "-" if value is None else printable(value)


def _last(row: dict[str, Any]) -> str:
    if row["last_tick"] is None:
        return "never"
    if row["last_skipped"] is not None:
        return f"{_utc(row['last_tick'])} skipped ({printable(row['last_skipped'])})"
    status = row["last_job_status"] or "pruned"
    return f"{_utc(row['last_tick'])} job {row['last_job_id']} {status}"


@main.group("schedules", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_context
def schedules_group(click_ctx: click.Context, as_json: bool) -> None:
    """Periodic jobs: definition, last tick and its job, next run, declared by a live daemon.
    `schedules declare` (an operator) declares the schedules of a daemon's config."""
    if click_ctx.invoked_subcommand is None:
        list_schedules(click_ctx.obj, as_json)


@schedules_group.command("declare")
@click.pass_obj
def declare_schedules(ctx: Context) -> None:
    """Declare the [schedules] of the --config file, as an operator: daemons fire only
    declared schedules, each tick's job built from the stored definition (schema 22)."""
    from pgworkerd.queue import schedules

    if not ctx.config_path:
        raise click.UsageError("schedules declare needs --config (the daemon's config file)")
    config = ctx.config()
    if not config.schedules:
        click.echo("no [schedules] in the config: nothing declared")
        return
    with database(ctx, needs="declare schedules") as conn:
        for name, schedule in sorted(config.schedules.items()):
            with conn.transaction():
                schedules.declare(conn, name, schedule.definition(), conn.info.user, ctx.schema)
            click.echo(f"declared schedule {printable(name)}")


def list_schedules(ctx: Context, as_json: bool) -> None:
    from pgworkerd.queue import schedules

    with database(ctx, needs="read schedules") as conn:
        rows = schedules.list_all(conn, ctx.schema)
    now = datetime.now(UTC)
    for row in rows:
        row["next_run"] = next_run(row["definition"], now)
    if as_json:
        echo_json(
            [
                {
                    "name": r["name"],
                    "definition": r["definition"],
                    "declared_by": r["declared_by"],
                    "declared_at": r["declared_at"],
                    "declared_now": r["declared_now"],
                    "runs": r["runs"],
                    "last_tick": r["last_tick"],
                    "last_job_id": r["last_job_id"],
                    "last_job_status": r["last_job_status"],
                    "last_skipped": r["last_skipped"],
                    "last_fired_by": r["last_fired_by"],
                    "next_run": r["next_run"],
                }
                for r in rows
            ]
        )
        return
    click.echo(f"schedules ({len(rows)}):")
    for r in rows:
        d = r["definition"] if isinstance(r["definition"], dict) else {}
        handler, queue = printable(str(d.get("handler"))), printable(str(d.get("queue")))
        declared = "declared" if r["declared_now"] else "NOT DECLARED by any live daemon"
        click.echo(
            f"  {printable(r['name'])}: {printable(_when(r['definition']))}, "
            f"handler {handler} on queue {queue}, "
            f"overlap {printable(str(d.get('overlap')))}; {declared}"
        )
        click.echo(f"    last: {_last(r)}")
        click.echo(f"    next: {_utc(r['next_run']) if r['declared_now'] else '- (not declared)'}")

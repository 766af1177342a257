"""`pgworkerd signal`: deliver a signal to a job that waits for it (durable waits)."""

from __future__ import annotations

import json
from typing import Any

import click

from pgworkerd import signals
from pgworkerd.cli import Context, database, fail, main
from pgworkerd.cli.display import echo_json, printable
from pgworkerd.exitcodes import ExitCode


@main.command("signal")
@click.argument("target")
@click.argument("name")
@click.option("--payload", help="any JSON value the resumed attempt sees as job.signal.payload")
@click.option(
    "--key",
    "by_key",
    is_flag=True,
    help="TARGET is a correlation key (WaitFor(..., key=...)), not a job id",
)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def signal_job(
    ctx: Context, target: str, name: str, payload: str | None, by_key: bool, as_json: bool
) -> None:
    """Send signal NAME to job TARGET (an id, or with --key a correlation key).

    A job suspended waiting for NAME (raise pgworkerd.WaitFor) becomes pending at once and
    its next attempt sees the signal (job.signal); a job not waiting for it yet keeps it,
    and its WaitFor for NAME returns at once. The first signal of a name wins: a second
    one is reported as ignored and changes nothing (exit 0). By key, when no live job
    holds KEY yet, the signal is parked under it (7 days) for the next job that waits
    with it. An unknown or finished job, a bad name or payload, a parked signal over its
    bounds: refused, nothing changed (exit 1).
    """
    value: Any = None
    if payload is not None:
        try:
            value = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--payload") from None
    job_id: int | None = None
    if not by_key:
        try:
            job_id = int(target)
        except ValueError:
            raise click.BadParameter(
                f"{printable(target)!r} is not a job id (give --key for a correlation key)",
                param_hint="TARGET",
            ) from None
    with database(ctx, needs="signal jobs") as conn:
        try:
            sent = signals.signal(
                conn,
                job_id,
                name,
                value,
                key=target if by_key else None,
                schema=ctx.schema,
            )
        except signals.SignalRefused as exc:
            fail(f"signal refused: {exc}", ExitCode.FAILURE)
    if as_json:
        echo_json(
            {
                "job_id": sent.job_id,
                "outcome": sent.outcome,
                "status": sent.status,
                "sent_at": sent.sent_at.isoformat(),
            }
        )
        return
    if sent.job_id is None:  # by key, and no live job of this login holds it yet
        what = f"key {printable(target)!r}: signal {printable(name)!r}"
        if sent.outcome == "parked":
            click.echo(
                f"{what} parked: no live job waits with this key yet; the next one that "
                "waits with it receives the signal (kept 7 days)"
            )
        else:
            click.echo(
                f"{what} ignored: one of that name is parked under the key already (sent "
                f"at {sent.sent_at:%Y-%m-%d %H:%M:%S %Z}); the first signal wins, nothing changed"
            )
        return
    what = f"job {sent.job_id}: signal {printable(name)!r}"
    if sent.outcome == "resumed":
        click.echo(f"{what} delivered: the job was waiting for it and is pending now")
    elif sent.outcome == "kept":
        click.echo(
            f"{what} kept: the job ({sent.status}) is not waiting for it yet; its next "
            f"WaitFor({printable(name)!r}) returns at once"
        )
    else:
        click.echo(
            f"{what} ignored: the job already had one of that name (sent at "
            f"{sent.sent_at:%Y-%m-%d %H:%M:%S %Z}); the first signal wins, nothing changed"
        )

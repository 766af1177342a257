"""Commands on jobs: enqueue, cancel, retry, prune, jobs, show, explain."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from pgworkerd import client, model
from pgworkerd.cli import Context, database, fail, main
from pgworkerd.cli.display import RawJson, echo_json, printable
from pgworkerd.cli.params import DURATION
from pgworkerd.config import RetentionConfig
from pgworkerd.durations import format_duration
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import admin, batchread, views
from pgworkerd.sizes import format_size


def _parse_payload(text: str) -> dict[str, Any]:
    try:
        return client.payload_from_json(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--payload") from None


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
    help="while a job with this key has not finished (or is within its --dedupe-window), "
    "return its id instead of adding another (see --dedupe-policy)",
)
@click.option(
    "--concurrency-key",
    help="jobs with one key share its slots of the handler's max_running_per_key",
)
@click.option(
    "--after",
    "after",
    type=int,
    multiple=True,
    metavar="ID",
    help="wait until job ID has finished (repeat for several parents)",
)
@click.option(
    "--on-parent-failure",
    type=click.Choice(["cancel", "run", "hold"]),
    help="when a parent ends dead or cancelled: cancel this job (default), run it anyway, "
    "or hold it for `pgworkerd release`",
)
@click.option(
    "--expires-at",
    type=click.DateTime(
        ["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
    ),
    help="do not start the job after this time (ISO 8601; local time if no offset)",
)
@click.option("--expire-in", type=DURATION, help="do not start the job after this long, e.g. 1h")
@click.option(
    "--timeout", type=DURATION, help="this job's timeout, overriding the handler's, e.g. 2h"
)
@click.option(
    "--dedupe-window",
    type=DURATION,
    help="keep the --dedupe-key held this long after the job finished, e.g. 1h (at most 365d)",
)
@click.option(
    "--dedupe-policy",
    type=click.Choice(["existing", "reject", "debounce"]),
    help="when the --dedupe-key is held: print the holder's id (existing, the default), "
    "fail with exit code 1 naming it (reject), or move the pending holder's run time to now "
    "+ --debounce, never past its enqueue + --debounce-max (debounce)",
)
@click.option("--debounce", type=DURATION, help="with --dedupe-policy debounce: e.g. 30s")
@click.option(
    "--debounce-max",
    type=DURATION,
    help="with --dedupe-policy debounce (required): the latest a job runs after its enqueue",
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
    concurrency_key: str | None,
    after: tuple[int, ...],
    on_parent_failure: str | None,
    expires_at: datetime | None,
    expire_in: float | None,
    timeout: float | None,
    dedupe_window: float | None,
    dedupe_policy: str | None,
    debounce: float | None,
    debounce_max: float | None,
) -> None:
    """Enqueue a job for HANDLER and print its id."""
    if run_at is not None and delay is not None:
        raise click.UsageError("give --run-at or --delay, not both")
    if expires_at is not None and expire_in is not None:
        raise click.UsageError("give --expires-at or --expire-in, not both")
    if run_at is not None and run_at.tzinfo is None:
        run_at = run_at.astimezone()
    if expires_at is not None and expires_at.tzinfo is None:
        expires_at = expires_at.astimezone()
    spec = client.JobSpec(
        handler,
        _parse_payload(payload),
        queue,
        priority,
        run_at,
        delay,
        max_attempts,
        dedupe_key,
        concurrency_key,
        after,
        on_parent_failure,
        expires_at,
        expire_in,
        timeout,
        dedupe_window,
        dedupe_policy,
        debounce,
        debounce_max,
    )
    try:
        spec.as_json()
    except client.InvalidJob as exc:
        fail(str(exc), ExitCode.CONFIG)
    with database(ctx, needs="enqueue jobs") as conn:
        try:
            [job_id] = client.enqueue_many(conn, [spec], schema=ctx.schema)
        except client.DuplicateJob as exc:
            conn.rollback()
            fail(
                f"not enqueued: its dedupe key is held by job {exc.job_id} "
                "(--dedupe-policy reject)",
                ExitCode.FAILURE,
            )
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
@click.argument("ids", nargs=-1, type=int, required=True)
@click.pass_obj
def release(ctx: Context, ids: tuple[int, ...]) -> None:
    """Release jobs held after a parent failed (on_parent_failure hold): each runs once
    its parents have all finished."""
    failed = False
    with database(ctx, needs="change jobs") as conn:
        for job_id in ids:
            try:
                status = admin.release_held(conn, job_id, schema=ctx.schema)
            except admin.NotHeld as exc:
                click.echo(f"{job_id}: {printable(str(exc))}")
                failed = True
            else:
                click.echo(f"{job_id}: released ({status})")
    if failed:
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
    if ids and (queue is not None or handler is not None):
        # Together they would narrow each other, and an id left out would look "changed".
        raise click.UsageError("give job ids or --queue/--handler, not both")
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


# Rows per table and statement of `prune` (the function's most: the fewest round trips).
PRUNE_BATCH = 10_000


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
@click.option(
    "--gone-daemons-older-than",
    "gone_older_than",
    type=DURATION,
    default="7d",
    show_default=True,
    help="retention of the registry rows of daemons that are gone",
)
@click.option(
    "--schedule-runs-older-than",
    "runs_older_than",
    type=DURATION,
    default="7d",
    show_default=True,
    help="retention of schedule run rows (each schedule's latest is kept)",
)
@click.pass_obj
def prune(
    ctx: Context,
    older_than: float,
    statuses: tuple[str, ...],
    gone_older_than: float,
    runs_older_than: float,
) -> None:
    """Delete finished jobs older than a retention, the registry rows of daemons gone
    longer than theirs, and schedule run rows older than theirs (what the daemons' own
    retention deletes, run to the end at once: the same component, the same statement)."""
    from pgworkerd.daemon.retention import RetentionBusy, prune_to_end

    chosen = statuses or model.FINAL_STATUSES
    kept = None  # a final status not chosen is kept
    config = RetentionConfig(
        completed=older_than if "completed" in chosen else kept,
        cancelled=older_than if "cancelled" in chosen else kept,
        dead=older_than if "dead" in chosen else kept,
        schedule_runs=runs_older_than,
        gone_daemons=gone_older_than,
        batch=PRUNE_BATCH,
    )
    with database(ctx, needs="delete jobs") as conn:
        try:
            pruned = prune_to_end(conn, config, ctx.schema)
        except RetentionBusy as exc:
            fail(str(exc), ExitCode.DATABASE)
    click.echo(f"deleted {pruned.jobs} job(s)")
    if pruned.daemons:
        click.echo(f"deleted {pruned.daemons} gone daemon(s) from the registry")
    if pruned.schedule_runs:
        click.echo(f"deleted {pruned.schedule_runs} schedule run(s)")


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
@click.option(
    "--text",
    help="only jobs whose payload or last error contains this (case-insensitive; no index"
    " serves it: it gives up after a few seconds, narrow it by status, queue or handler)",
)
@click.option("--before", type=int, help="only jobs with a lower id (the next page)")
@click.option("--limit", type=click.IntRange(1, views.MAX_PAGE_SIZE), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def list_jobs(
    ctx: Context,
    statuses: tuple[str, ...],
    queue: str | None,
    handler: str | None,
    text: str | None,
    before: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    with database(ctx) as conn:
        try:
            page = views.jobs_page(
                conn,
                ctx.schema,
                statuses=statuses or None,
                queue=queue,
                handler=handler,
                text=text,
                before=before,
                limit=limit,
            )
        except views.TextSearchTimeout as exc:
            fail(str(exc), ExitCode.FAILURE)
    rows = page["jobs"]
    if as_json:
        echo_json(rows)
    else:
        _print_jobs(rows)
    if page["older"] is not None:  # on stderr: the listing (and its JSON) stays as it was
        click.echo(f"(more: --before {page['older']})", err=True)


def _print_jobs(rows: list[dict[str, Any]]) -> None:
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
    """Show one job with every column, its last error and traceback, and its attempts."""
    with database(ctx) as conn:
        row = views.job(conn, ctx.schema, job_id)
        batch = batchread.batch_of(conn, ctx.schema, job_id) if row is not None else None
    if row is None:
        fail(f"job {job_id} not found", ExitCode.FAILURE)
    if as_json:
        echo_json(row | ({"batch": batch} if batch is not None else {}))
        return
    history = row.pop("attempt_history")
    daemon = row.pop("daemon")
    family = {k: row.pop(k) for k in ("parents", "children", "parents_total", "children_total")}
    received = row.pop("signals", None)
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
    if daemon is not None:
        click.echo(daemon_line(daemon, job_id))
    for side in ("parents", "children"):
        if family[side]:
            click.echo(f"{side}: {relatives_line(family[side], family[side + '_total'])}")
    if received:
        click.echo(signal_lines(received))
    if batch is not None:
        click.echo(f"batch: {batchread.batch_line(batch, job_id)}")
    held = dedupe_hold_line(row)
    if held is not None:
        click.echo(held)
    if history is None:
        click.echo(
            "attempts: (this role may not read them: roles.sql's pgworkerd_reader and "
            "pgworkerd_operator may)"
        )
        return
    click.echo(f"attempts: {len(history)} recorded" + (":" if history else ""))
    for a in history:
        click.echo("  " + attempt_line(a))
        error = str(a["error"] or "").rstrip("\n")
        if error:
            click.echo("\n".join(f"      {printable(ln)}" for ln in error.split("\n")))


def dedupe_hold_line(row: dict[str, Any]) -> str | None:
    """How long a finished job holds its dedupe key (its dedupe_window, schema 34); None
    when it holds none past its finish."""
    window, finished = row.get("dedupe_window_seconds"), row.get("finished_at")
    if row.get("dedupe_key") is None or window is None or not isinstance(finished, datetime):
        return None
    until = finished + timedelta(seconds=float(window))
    key = printable(row["dedupe_key"])
    if until > datetime.now(UTC):
        return f"dedupe: key '{key}' held by this finished job until {until.isoformat()}"
    return f"dedupe: key '{key}' was held until {until.isoformat()} (released at its next enqueue)"


def relatives_line(jobs: list[dict[str, Any]], total: int) -> str:
    """`show`'s line of a job's parents or children (schema 27): id, status and handler of
    each, "pruned" for a parent deleted since."""
    shown = ", ".join(
        f"{j['id']} {printable(j['status'] or 'pruned')} {printable(j['handler'] or '')}".rstrip()
        for j in jobs
    )
    return shown + (f" (and {total - len(jobs)} more)" if total > len(jobs) else "")


def signal_lines(received: list[dict[str, Any]]) -> str:
    """`show`'s lines on the signals a job received (durable waits)."""
    total = received[0]["total"] if received else 0
    lines = [
        f"signals: {total} received"
        + (f" ({len(received)} newest shown)" if total > len(received) else "")
        + ":"
    ]
    for s in received:
        payload = "-" if s["payload"] is None else printable(s["payload"])
        cut = s["payload_chars"] is not None and s["payload_chars"] > len(s["payload"] or "")
        lines.append(
            f"  {printable(s['name'])}  {printable(s['sent_at'])}  by {printable(s['sent_by'])}"
            f"  payload {payload}" + (f" ... ({s['payload_chars']} characters)" if cut else "")
        )
    return "\n".join(lines)


def daemon_line(d: dict[str, Any], job_id: int) -> str:
    """`show`'s line on the daemon holding a running job, saying when it is silent."""

    def age(seconds: float | None) -> str:
        return "-" if seconds is None else format_duration(seconds, rounded=True)

    line = (
        f"daemon: {printable(d['id'])} on {printable(d['host'])} pid {d['pid']}"
        f" ({printable(d['state'])}), heartbeat {age(d['heartbeat_age_seconds'])} ago"
        f" (every {age(d['heartbeat_interval_seconds'])})"
    )
    if not d["silent"]:
        return line
    left = d["lease_left_seconds"]
    frees = f"in {age(left)}" if left is not None and left > 0 else "now (expired)"
    return (
        f"{line}: SILENT (dead, frozen or cut off from the database); the job is not"
        f" taken from it early: its lease frees it {frees} (pgworkerd explain {job_id})"
    )


def attempt_line(a: dict[str, Any]) -> str:
    """One attempt of `show`: number, outcome, where, when, and what it cost (the figures
    a daemon measured; '-' where none were, e.g. a worker finishing from SQL)."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}s"

    where = printable(a["worker"] or "?") + (f" on {printable(a['host'])}" if a["host"] else "")
    peak = "-" if a["peak_memory"] is None else format_size(a["peak_memory"])
    return (
        f"#{a['attempt']} {a['outcome']}  {where}  {printable(a['started_at'])} .. "
        f"{printable(a['finished_at'])}  wall {seconds(a['wall_seconds'])}  "
        f"cpu {seconds(a['cpu_user_seconds'])} user {seconds(a['cpu_system_seconds'])} "
        f"system  peak {peak}"
    )


@main.command("explain")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def explain_job(ctx: Context, job_id: int, as_json: bool) -> None:
    """Why a job is not running now (every reason, each with a stable code), or what
    happened to it. Reads the database only, so it works from any host.

    Exit code 0; 1 for an unknown id.
    """
    from pgworkerd.queue import explain

    with database(ctx) as conn:
        found = explain.explain(conn, ctx.schema, job_id)
    if found is None:
        fail(f"job {job_id} not found", ExitCode.FAILURE)
    if as_json:
        echo_json(found)
        return
    click.echo(
        f"job {found['id']}: {found['status']}, handler '{printable(found['handler'])}'"
        f" on queue '{printable(found['queue'])}'"
    )
    for r in found["reasons"]:
        click.echo(f"  [{r['code']}] {printable(r['message'])}")


@main.command("batch")
@click.argument("batch_id", type=int)
@click.option(
    "--members",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="list this many members (the first by id)",
)
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def show_batch(ctx: Context, batch_id: int, members: int, as_json: bool) -> None:
    """Show batch BATCH_ID (docs/guide/batches.md): how many of its members finished
    (completed, dead, cancelled), its callback, and its first members. `pgworkerd show`
    of a member or the callback names its batch."""
    with database(ctx) as conn:
        found = batchread.batch_view(conn, ctx.schema, batch_id, members)
    if found is None:
        fail(f"batch {batch_id} not found (never enqueued, or pruned)", ExitCode.FAILURE)
    if as_json:
        echo_json(found)
        return
    finished = found["completed"] + found["dead"] + found["cancelled"]
    click.echo(
        f"batch {found['id']}: {finished} of {found['members']} members finished "
        f"({found['completed']} completed, {found['dead']} dead, {found['cancelled']} cancelled)"
    )
    click.echo(
        f"callback: job {found['callback_id']} {printable(found['callback_handler'] or '')} "
        f"{printable(found['callback_status'] or 'pruned')}"
        + (f", released at {found['released_at']}" if found["released_at"] else "")
    )
    listed = found["first_members"]
    click.echo(f"members ({len(listed)} of {found['members']} shown):")
    for m in listed:
        error = printable(str(m["error"] or "").strip().split("\n")[-1])[:80]
        click.echo(f"  {m['id']:>8} {m['status']:<9} {error}".rstrip())

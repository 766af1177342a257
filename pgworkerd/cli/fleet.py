"""Commands on the fleet of daemons, through the database: status, drain, resume, pause."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

import click

from pgworkerd.cli import Context, database, fail, main
from pgworkerd.cli.display import RawJson, echo_json, printable
from pgworkerd.cli.params import DURATION
from pgworkerd.durations import format_duration
from pgworkerd.exitcodes import ExitCode


def age(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds, rounded=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_obj
def status(ctx: Context, as_json: bool) -> None:
    """Daemons, running jobs, counts per queue, and jobs no daemon serves.

    Exit code 0; 1 when a drain is left in place, jobs wait for a handler nobody serves,
    or running jobs are held by a silent daemon (no heartbeat for twice its interval).
    """
    from pgworkerd.queue import views

    with database(ctx, needs="read jobs") as conn:
        snap = views.status(conn, ctx.schema)
    live = [d for d in snap["daemons"] if d["state"] != "gone"]
    drained = [d for d in live if d["drain_requested"] or d["hand_back_requested_at"]]
    stuck = [j for j in snap["running_jobs"] if j["daemon_silent"]]
    if as_json:
        echo_json(snap)
    else:
        for d in drained:
            if d["hand_back_requested_at"] is not None:
                click.secho(
                    f"WARNING: daemon {printable(d['id'])} on {printable(d['host'])} is HANDING"
                    f" BACK {_hand_back_what(d)} and claims none of them; "
                    f"`pgworkerd resume --worker {printable(d['id'])}` (or --all) undoes it",
                    fg="red",
                    bold=True,
                    err=True,
                )
                continue
            click.secho(
                f"WARNING: daemon {printable(d['id'])} on {printable(d['host'])} is DRAINED "
                "and takes no jobs; "
                f"`pgworkerd resume --worker {printable(d['id'])}` (or --all) undoes it",
                fg="red",
                bold=True,
                err=True,
            )
        _warn_silent(stuck)
        click.echo(f"daemons ({len(live)} live):")
        for d in snap["daemons"]:
            click.echo(f"  {_daemon_line(d)}")
        click.echo(f"running jobs ({len(snap['running_jobs'])}):")
        for j in snap["running_jobs"]:
            progress = _progress(j["progress"])
            silent = (
                f"  DAEMON SILENT {age(j['daemon_heartbeat_age_seconds'])}, lease ends"
                f" {_utc(j['locked_until'])}"
                if j["daemon_silent"]
                else ""
            )
            click.echo(
                f"  {j['id']:>8} {printable(j['handler']):<24} attempt {j['attempts']}/"
                f"{j['max_attempts']}  {age(j['age_seconds'])}  on {printable(j['locked_by'])}"
                f"{silent}  {progress}".rstrip()
            )
        click.echo("jobs per queue:")
        for queue, by_status in sorted(snap["counts"].items()):
            parts = ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
            click.echo(f"  {printable(queue)}: {parts}")
        if snap["other_queues"]:
            parts = ", ".join(f"{s} {n}" for s, n in sorted(snap["other_queues"].items()))
            click.echo(f"  (all other queues): {parts}")
        click.echo(f"oldest due pending job: {age(snap['oldest_pending_seconds'])}")
        click.echo(f"paused ({len(snap['paused'])}):")
        for p in snap["paused"]:
            click.echo(f"  {_paused_line(p)}")
        for u in snap["unserved"]:
            click.secho(
                f"WARNING: {u['jobs']} pending job(s) of handler {u['handler']!r} on "
                f"queue {u['queue']!r} have no live daemon serving them (oldest "
                f"{age(u['oldest_seconds'])})",
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
    if drained or snap["unserved"] or stuck:
        sys.exit(int(ExitCode.FAILURE))


def _hand_back_what(d: dict[str, Any]) -> str:
    """What a daemon's hand-back targets and its grace, from its registry row."""
    parts = []
    if d["hand_back_queues"] is not None:
        parts.append("queue(s) " + ", ".join(map(printable, d["hand_back_queues"])))
    if d["hand_back_handlers"] is not None:
        parts.append("handler(s) " + ", ".join(map(printable, d["hand_back_handlers"])))
    what = "the jobs of " + " and ".join(parts) if parts else "every job"
    grace = d["hand_back_grace"]
    return what + (
        " (grace: each handler's stop_grace)"
        if grace is None
        else f" (grace {format_duration(grace)})"
    )


def _warn_silent(stuck: list[dict[str, Any]]) -> None:
    """One warning per silent daemon holding running jobs: which, since when, and when
    their leases free them (nothing frees them earlier: see `pgworkerd explain`)."""
    by_daemon: dict[str, list[dict[str, Any]]] = {}
    for j in stuck:
        by_daemon.setdefault(j["locked_by"], []).append(j)
    for worker, jobs in by_daemon.items():
        ids = ", ".join(str(j["id"]) for j in jobs[:20]) + (", ..." if len(jobs) > 20 else "")
        left = max((j["lease_left_seconds"] or 0.0 for j in jobs), default=0.0)
        click.secho(
            f"WARNING: daemon {printable(worker)} on {printable(jobs[0]['daemon_host'])} is"
            f" SILENT (no heartbeat for {age(jobs[0]['daemon_heartbeat_age_seconds'])}) with"
            f" {len(jobs)} running job(s): {ids}; dead, frozen or cut off from the database."
            " They are not taken from it early: their leases free them"
            + (f" within {age(left)}" if left > 0 else " now (expired)"),
            fg="red",
            bold=True,
            err=True,
        )


def _paused_by(p: dict[str, Any]) -> str:
    """Who paused: the person who asked (schema 38) and the database role, or the role."""
    person = p.get("requested_by")
    role = printable(p["paused_by"])
    return f"{printable(person)} (role {role})" if person else role


def _paused_line(p: dict[str, Any]) -> str:
    line = (
        f"{p['kind']} {printable(p['name'])} since {_utc(p['paused_at'])} "
        f"({age(p['paused_seconds'])} ago) by {_paused_by(p)}"
    )
    return f"{line}: {printable(p['comment'])}" if p["comment"] else line


def _daemon_line(d: dict[str, Any]) -> str:
    head = f"{printable(d['id']):<32} {printable(d['host']):<16} pid {d['pid']:<7}"
    if d["state"] != "gone":
        return (
            f"{head} {printable(d['state']):<9} {d['busy']}/{d['slots']} busy  "
            f"up {age(d['uptime_seconds'])}  heartbeat {age(d['heartbeat_age_seconds'])} ago"
            + (f" SILENT (every {age(d['heartbeat_interval_seconds'])})" if d["silent"] else "")
        )
    # Gone: a fixed point in time, not ages that keep growing after the daemon stopped.
    stopped = d["stopped_at"] or d["heartbeat_at"]
    ran = (
        age((stopped - d["started_at"]).total_seconds())
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


def _no_daemon(conn: Any, schema: str, worker: str | None, target: str) -> None:
    """Exit 1 saying why no daemon matched: for --worker, whether it is gone or unknown."""
    from pgworkerd.queue import fleet

    why = f"no live daemon matches ({target})"
    if worker:
        row = fleet.find_daemon(conn, schema, worker)
        if row is None:
            why += ": no daemon has this id (`pgworkerd status` lists them)"
        else:
            why += f": it is gone since {_utc(row['stopped_at'] or row['heartbeat_at'])}"
    fail(why, ExitCode.FAILURE)


def _hand_back_filter(kind: str, names: tuple[str, ...]) -> list[str] | None:
    """--queue/--handler values of a hand-back: None (all), or checked names (exit 3)."""
    from pgworkerd.bounds import name_problem

    if not names:
        return None
    if len(names) > 100:
        fail(f"at most 100 --{kind} values, not {len(names)}", ExitCode.CONFIG)
    for name in names:
        problem = name_problem(kind, name)
        if problem:
            fail(problem, ExitCode.CONFIG)
    return sorted(set(names))


@main.command()
@click.option("--all", "all_hosts", is_flag=True, help="every daemon on every host")
@click.option("--worker", help="one daemon, by the id `status` shows")
@click.option(
    "--hand-back",
    is_flag=True,
    help="also ask running handlers to stop (job.stop_requested) and hand their jobs back "
    "(pending at once, attempt not counted, checkpoint kept) when the grace ends",
)
@click.option(
    "--grace",
    type=DURATION,
    help="with --hand-back: how long handlers have to stop (0 to 1 day; default: each "
    "handler's stop_grace)",
)
@click.option(
    "--queue", "queues", multiple=True, help="with --hand-back: only this queue's jobs (repeatable)"
)
@click.option(
    "--handler",
    "handlers",
    multiple=True,
    help="with --hand-back: only this handler's jobs (repeatable)",
)
@click.option(
    "--wait",
    is_flag=True,
    help="wait until their running jobs have finished (with --hand-back: have been handed "
    "back or finished)",
)
@click.option(
    "--timeout",
    type=DURATION,
    help="with --wait: give up after this long (exit 1, listing the jobs still running)",
)
@click.pass_obj
def drain(
    ctx: Context,
    all_hosts: bool,
    worker: str | None,
    hand_back: bool,
    grace: float | None,
    queues: tuple[str, ...],
    handlers: tuple[str, ...],
    wait: bool,
    timeout: float | None,
) -> None:
    """Ask daemons to stop claiming jobs (they stay up until stopped or resumed). Their
    running jobs finish; with --hand-back they are asked to stop and handed back to
    other daemons after the grace.

    Exit code 0 when drained; 1 when --timeout expired or no live daemon matched; 3 for a
    bad value; 4/5 for database/schema trouble.
    """
    from pgworkerd.config import stop_grace_problem

    target = _drain_target(worker, all_hosts)
    if timeout is not None and not wait:
        raise click.UsageError("--timeout only applies with --wait")
    if not hand_back and (grace is not None or queues or handlers):
        raise click.UsageError(
            "--grace, --queue and --handler apply to --hand-back only (a plain drain lets "
            "every running job finish)"
        )
    if grace is not None:
        problem = stop_grace_problem(grace)
        if problem:
            fail(f"--grace {problem}", ExitCode.CONFIG)
    only_queues = _hand_back_filter("queue", queues)
    only_handlers = _hand_back_filter("handler", handlers)
    with database(ctx, needs="change the daemons' registry") as conn:
        if hand_back:
            ids = _hand_back(
                ctx, conn, target, worker, all_hosts, grace, only_queues, only_handlers
            )
            if wait:
                _wait_handed_back(ctx, conn, ids, target, timeout)
            return
        _plain_drain(ctx, conn, target, worker, all_hosts, wait, timeout)


def _hand_back(
    ctx: Context,
    conn: Any,
    target: str,
    worker: str | None,
    all_hosts: bool,
    grace: float | None,
    queues: list[str] | None,
    handlers: list[str] | None,
) -> list[str]:
    """Request the hand-back; returns the ids of the daemons asked."""
    from pgworkerd.queue import fleet

    affected = fleet.request_hand_back(
        conn,
        ctx.schema,
        grace=grace,
        queues=queues,
        handlers=handlers,
        worker_id=worker,
        all_hosts=all_hosts,
    )
    if not affected:
        _no_daemon(conn, ctx.schema, worker, target)
    what = _hand_back_what(
        {"hand_back_queues": queues, "hand_back_handlers": handlers, "hand_back_grace": grace}
    )
    click.echo(
        f"hand-back requested for {len(affected)} daemon(s): "
        + ", ".join(printable(a["id"]) for a in affected)
        + f": {what}"
    )
    return [a["id"] for a in affected]


def _wait_handed_back(
    ctx: Context, conn: Any, ids: list[str], target: str, timeout: float | None
) -> None:
    from pgworkerd.queue import fleet, registry

    shown = ""

    def report(progress: fleet.HandBackProgress) -> None:
        nonlocal shown
        for worker_id, host, pid in progress.marked_gone:
            click.echo(
                f"daemon {printable(worker_id)} (host {printable(host)} pid {pid}) has been"
                f" silent for {registry.STALE_AFTER_SECONDS:.0f} s: marked gone; its jobs go"
                " back to the queue when their leases expire"
            )
        if progress.drained:
            return
        jobs_left = progress.running_jobs
        line = f"waiting for {len(progress.busy)} daemon(s), {len(jobs_left)} job(s) to hand back"
        line += f": {', '.join(map(str, jobs_left[:20]))}" if jobs_left else ""
        if line != shown:
            click.echo(line)
            shown = line

    last = fleet.wait_handed_back(conn, ctx.schema, ids, timeout, report)
    if last.drained:
        click.echo("handed back: no targeted jobs running on " + target)
        return
    click.echo(
        f"timed out; still running: {', '.join(map(str, last.running_jobs)) or '-'}"
        " (the hand-back stays requested; `pgworkerd resume` undoes it)",
        err=True,
    )
    sys.exit(int(ExitCode.FAILURE))


def _plain_drain(
    ctx: Context,
    conn: Any,
    target: str,
    worker: str | None,
    all_hosts: bool,
    wait: bool,
    timeout: float | None,
) -> None:
    from pgworkerd.queue import fleet, registry

    affected = fleet.request_drain(
        conn, ctx.schema, drain=True, worker_id=worker, all_hosts=all_hosts
    )
    if not affected:
        _no_daemon(conn, ctx.schema, worker, target)
    click.echo(
        f"drain requested for {len(affected)} daemon(s): "
        + ", ".join(printable(a["id"]) for a in affected)
    )
    if not wait:
        return
    shown = ""

    def report(progress: fleet.DrainProgress) -> None:
        nonlocal shown
        for worker_id, host, pid in progress.marked_gone:
            click.echo(
                f"daemon {printable(worker_id)} (host {printable(host)} pid {pid})"
                " has been silent for"
                f" {registry.STALE_AFTER_SECONDS:.0f} s: marked gone (killed, or cut"
                " off from the database: then its jobs stop by the end of their"
                " leases); they go back to the queue when their leases expire"
            )
        if progress.drained:
            return
        jobs_left = progress.running_jobs
        line = f"waiting for {len(progress.busy)} daemon(s), {len(jobs_left)} job(s) running"
        line += f": {', '.join(map(str, jobs_left[:20]))}" if jobs_left else ""
        if line != shown:  # a line each time something changed, not every poll
            click.echo(line)
            shown = line

    last = fleet.wait_drained(conn, ctx.schema, {a["id"] for a in affected}, timeout, report)
    if last.drained:
        click.echo("drained: no jobs running on " + target)
        return
    click.echo(
        f"timed out; still running: {', '.join(map(str, last.running_jobs)) or '-'}"
        " (the drain stays requested; `pgworkerd resume` undoes it)",
        err=True,
    )
    sys.exit(int(ExitCode.FAILURE))


def _os_user() -> str:
    """The OS user running the CLI: who asked for a pause when --by does not say."""
    import getpass

    try:
        return getpass.getuser()[:128] or "unknown"
    except (OSError, KeyError):  # no name for the uid (a container's arbitrary uid)
        return f"uid {os.getuid()}"


def _pause_target(queue: str | None, handler: str | None) -> tuple[str, str]:
    """(kind, name) of --queue or --handler; a bad name exits 3 before any connection."""
    from pgworkerd.bounds import name_problem

    if queue is not None and handler is not None:
        raise click.UsageError("give --queue or --handler, not both")
    kind, name = ("queue", queue) if queue is not None else ("handler", handler)
    problem = name_problem(kind, name)
    if problem:
        fail(problem, ExitCode.CONFIG)
    assert name is not None
    return kind, name


@main.command()
@click.option("--queue", help="pause this queue: none of its jobs are claimed")
@click.option("--handler", help="pause this handler: none of its jobs are claimed")
@click.option(
    "--reason",
    "--comment",
    "reason",
    help="why, shown by `status` and the dashboard (one line, at most 500 characters)",
)
@click.option(
    "--by",
    "by",
    help="who asks, shown with the pause (at most 128 characters; default: your OS user name)",
)
@click.pass_obj
def pause(
    ctx: Context, queue: str | None, handler: str | None, reason: str | None, by: str | None
) -> None:
    """Pause a queue or a handler on every daemon: its pending jobs stay pending, running
    ones finish. `pgworkerd resume --queue/--handler` undoes it. The pause records the
    reason and who asked (--by, else the OS user: the database role is shared by every
    operator).

    Exit code 0, also when it was paused already (the first pause is kept).
    """
    from pgworkerd.queue import fleet

    if queue is None and handler is None:
        raise click.UsageError("give --queue or --handler")
    kind, name = _pause_target(queue, handler)
    if by is None:
        by = _os_user()
    for problem in (
        fleet.pause_text_problem("--reason", reason, fleet.REASON_MAX, empty_ok=True),
        fleet.pause_text_problem("--by", by, fleet.BY_MAX),
    ):
        if problem:
            fail(problem, ExitCode.CONFIG)
    with database(ctx, needs="pause queues and handlers") as conn:
        changed = fleet.set_paused(
            conn, ctx.schema, kind, name, pause=True, comment=reason, requested_by=by
        )
        served = fleet.served(conn, ctx.schema, kind, name)
    shown = f"{kind} '{printable(name)}'"
    click.echo(f"paused {shown}" if changed else f"{shown} was already paused")
    if not served:  # paused ahead of time, or a typo: either way the user should know
        click.echo(
            f"note: no live daemon serves {shown} (a typo? `pgworkerd status --json` shows what"
            " the daemons serve); the pause holds for any daemon that serves it later",
            err=True,
        )


@main.command()
@click.option("--all", "all_hosts", is_flag=True, help="every daemon on every host")
@click.option("--worker", help="one daemon, by the id `status` shows")
@click.option("--queue", help="resume a paused queue instead (see `pause`)")
@click.option("--handler", help="resume a paused handler instead (see `pause`)")
@click.pass_obj
def resume(
    ctx: Context, all_hosts: bool, worker: str | None, queue: str | None, handler: str | None
) -> None:
    """Undo a drain: the daemons claim jobs again. With --queue or --handler: undo a
    pause (exit code 0, also when it was not paused)."""
    from pgworkerd.queue import fleet

    if queue is not None or handler is not None:
        if all_hosts or worker:
            raise click.UsageError("--queue/--handler resume a pause; --all/--worker a drain")
        kind, name = _pause_target(queue, handler)
        with database(ctx, needs="pause queues and handlers") as conn:
            changed = fleet.set_paused(conn, ctx.schema, kind, name, pause=False)
        shown = f"{kind} '{printable(name)}'"
        click.echo(f"resumed {shown}" if changed else f"{shown} was not paused")
        return
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


@main.command("handler-default")
@click.argument("handler", required=False)
@click.option(
    "--dedupe-policy",
    type=click.Choice(["existing", "reject", "debounce", "none"]),
    help="set HANDLER's default: what an enqueue that names no --dedupe-policy does when "
    "its --dedupe-key is held (see `enqueue`); none removes it (the holder's id again)",
)
@click.option("--debounce", type=DURATION, help="with --dedupe-policy debounce: e.g. 30s")
@click.option(
    "--debounce-max",
    type=DURATION,
    help="with --dedupe-policy debounce (required): the latest a job runs after its enqueue",
)
@click.pass_obj
def handler_default(
    ctx: Context,
    handler: str | None,
    dedupe_policy: str | None,
    debounce: float | None,
    debounce_max: float | None,
) -> None:
    """Show the handlers' default dedupe policies (HANDLER's, or every one), or set
    HANDLER's with --dedupe-policy. The default lives in the database (the enqueuers do
    not read the daemons' config): an enqueue that names a policy follows its own.

    Exit code 0; 3 for a value the database refuses (nothing changes).
    """
    from pgworkerd.queue import fleet

    if dedupe_policy is None:
        if debounce is not None or debounce_max is not None:
            raise click.UsageError("--debounce and --debounce-max go with --dedupe-policy")
        with database(ctx, needs="read handlers' defaults") as conn:
            rows = fleet.handler_defaults(conn, ctx.schema, handler)
        for r in rows:
            extra = ""
            if r["dedupe_policy"] == "debounce":
                extra = (
                    f" {format_duration(r['debounce_seconds'])},"
                    f" at most {format_duration(r['debounce_max_seconds'])}"
                )
            click.echo(
                f"{printable(r['handler'])}: {r['dedupe_policy']}{extra}"
                f" (set by {printable(r['set_by'])} at {r['set_at']:%Y-%m-%d %H:%M:%S %Z})"
            )
        if not rows:
            click.echo(
                "no handler has a default dedupe policy"
                if handler is None
                else f"handler '{printable(handler)}' has no default dedupe policy"
            )
        return
    if handler is None:
        raise click.UsageError("give the HANDLER whose default --dedupe-policy sets")
    policy = None if dedupe_policy == "none" else dedupe_policy
    with database(ctx, needs="set handlers' defaults") as conn:
        fleet.set_handler_default(conn, ctx.schema, handler, policy, debounce, debounce_max)
    shown = f"handler '{printable(handler)}'"
    click.echo(
        f"{shown}: default dedupe policy removed"
        if policy is None
        else f"{shown}: default dedupe policy {policy}"
    )

"""`pgworkerd logs`: what a job's attempts printed (migration 0015, pgworkerd.queue.joblogs).

A job's output is the job's to choose, so it is shown inert: every control character but
newline and tab is written as an escape (an ESC sequence cannot clear, retitle or recolour
the operator's terminal, a carriage return cannot overwrite a line).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import click
import psycopg

from pgworkerd.cli import Context, database, fail, main
from pgworkerd.cli.display import echo_json, printable
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import joblogs

# --follow looks for new output this often (the daemon stores it about once a second).
FOLLOW_INTERVAL = 0.5
# After its attempt ended, --follow waits this long for the daemon's last write.
FOLLOW_GRACE = 5.0


def _echo(text: str) -> None:
    if text:
        sys.stdout.write("\n".join(printable(line, keep="\t") for line in text.split("\n")))
        sys.stdout.flush()


def _attempt_to_follow(found: dict[str, Any], attempt: int | None) -> int | None:
    """The lease token of the attempt to follow: the running one (if it is `attempt`,
    when given), else the latest stored one of `attempt`; None: none yet."""
    if found["status"] == "running" and attempt in (None, found["attempts"]):
        return int(found["lease_token"])
    if attempt is None and found["status"] == "pending":
        return None  # (its next attempt: the earlier ones have ended)
    return int(found["logs"][-1]["lease_token"]) if found["logs"] else None


def _follow(conn: psycopg.Connection, ctx: Context, job_id: int, attempt: int | None) -> None:
    """Print an attempt's output as it comes, until it ended: the running attempt, or
    (the job pending) the next one."""
    token: int | None = None
    follower = joblogs.Follower()
    over_since: float | None = None
    while True:
        found = joblogs.read_logs(conn, ctx.schema, job_id, attempt)
        if found is None:
            fail(f"job {job_id} not found (deleted meanwhile)", ExitCode.FAILURE)
        token = _attempt_to_follow(found, attempt) if token is None else token
        entry = next((e for e in found["logs"] if e["lease_token"] == token), None)
        if entry is not None:
            _echo(follower.next_text(entry))
            if entry["finished"]:
                return
        running = found["status"] == "running" and found["lease_token"] == token
        if not running and (token is not None or found["status"] != "pending"):
            # Its attempt is over (or the job is): give the daemon time for its last write.
            over_since = time.monotonic() if over_since is None else over_since
            if time.monotonic() - over_since > FOLLOW_GRACE:
                return
        time.sleep(FOLLOW_INTERVAL)


def _without_tokens(found: dict[str, Any]) -> dict[str, Any]:
    """`found` without its lease tokens: a token is what fences a holder's writes
    (job_lease_assert), so it is never printed (a reader may run `logs --json`); the
    attempt number tells the attempts apart."""
    shown = {k: v for k, v in found.items() if k != "lease_token"}
    shown["logs"] = [{k: v for k, v in e.items() if k != "lease_token"} for e in found["logs"]]
    return shown


@main.command("logs")
@click.argument("job_id", type=int)
@click.option(
    "--attempt",
    type=click.IntRange(1),
    help="that attempt's output [default: the latest attempt with output]",
)
@click.option(
    "-f", "--follow", is_flag=True, help="print new output as it comes, until the attempt ends"
)
@click.option("--json", "as_json", is_flag=True, help="JSON output (every attempt's, or ATTEMPT's)")
@click.pass_obj
def logs(ctx: Context, job_id: int, attempt: int | None, follow: bool, as_json: bool) -> None:
    """Print what job JOB_ID printed: stdout, stderr and Python logging, per attempt.

    Up to [logs] max_bytes_per_attempt is kept per attempt: its first and last halves,
    with a "[... N bytes omitted ...]" line between them when more was printed."""
    if follow and as_json:
        raise click.UsageError("give --follow or --json, not both")
    with database(ctx) as conn:
        found = joblogs.read_logs(conn, ctx.schema, job_id, attempt)
        if found is None:
            fail(f"job {job_id} not found", ExitCode.FAILURE)
        if as_json:
            echo_json(_without_tokens(found))
            return
        if attempt is not None and attempt > found["attempts"] and not follow:
            fail(
                f"job {job_id} has had {found['attempts']} attempt(s), not {attempt}",
                ExitCode.FAILURE,
            )
        if follow:
            with contextlib.suppress(KeyboardInterrupt):
                _follow(conn, ctx, job_id, attempt)
            return
        if not found["logs"]:
            which = f"attempt {attempt} of job {job_id}" if attempt else f"job {job_id}"
            fail(
                f"no output of {which} is stored (it printed nothing, or ran without capture)",
                ExitCode.FAILURE,
            )
        for entry in found["logs"] if attempt else found["logs"][-1:]:
            text = joblogs.text_of(entry)
            _echo(text if text.endswith("\n") else text + "\n")

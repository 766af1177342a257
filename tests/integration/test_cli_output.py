"""Acceptance tier: what the operator's commands print when rows are hostile, when the
role may not read, and the small things an operator trips over (the `pgworkerd` commands
run in the test's process, tests/support/clirun.py, against the suite's PostgreSQL)."""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_cli_queue import Cli, run

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import admin


@pytest.fixture
def cli(test_db_dsn: str, schema: str, conn: psycopg.Connection) -> Cli:
    return Cli(test_db_dsn, schema, conn)


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN/Infinity, which Python emits but JSON does not allow."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def plant(cli: Cli, **columns: Any) -> int:
    """Insert a job row directly as the schema owner, as an old row or a direct INSERT
    would be, past any CHECK a later migration added on these columns (the CLI must
    still show such rows); returns its id."""
    table = sql.Identifier(cli.schema, "jobs")
    checks = cli.conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'c'",
        [f"{cli.schema}.jobs"],
    ).fetchall()
    for name, definition in checks:
        if any(re.search(rf"\b{re.escape(c)}\b", definition) for c in columns):
            cli.conn.execute(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, sql.Identifier(name))
            )
    columns.setdefault("handler", "h")
    row = cli.conn.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
            table,
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns)),
        ),
        list(columns.values()),
    ).fetchone()
    assert row is not None
    return int(row[0])


# -- 1. reads never crash on a row Python cannot load -----------------------------------------

DEEP = '{"a": ' * 5000 + "1" + "}" * 5000
LONG_INT = '{"n": 1' + "0" * 5000 + "}"
POISON = {
    "run_at -infinity": ({"run_at": "-infinity"}, "-infinity"),
    "run_at infinity": ({"run_at": "infinity"}, "infinity"),
    "run_at year 20000": ({"run_at": "20000-01-01 00:00:00+00"}, "20000-01-01"),
    "payload 5000-digit integer": ({"payload": LONG_INT}, "1" + "0" * 5000),
    "payload nested 5000 deep": ({"payload": DEEP}, '{"a": {"a": {"a"'),
    "progress 5000-digit integer": ({"progress": LONG_INT}, "1" + "0" * 5000),
}


@pytest.mark.parametrize("kind", list(POISON))
def test_reads_show_a_row_python_cannot_load(cli: Cli, kind: str) -> None:
    columns, shown = POISON[kind]
    innocent = cli.enqueue("innocent")
    poison = plant(cli, **columns)

    text = cli("jobs").stdout
    assert re.search(rf"^\s*{poison}\s+pending\b", text, re.M), text
    assert re.search(rf"^\s*{innocent}\s+pending\s+default\s+innocent\b", text, re.M), text

    listed = strict_json(cli("jobs", "--json").stdout)
    assert [r["id"] for r in listed] == [poison, innocent]
    [column] = columns
    if column != "payload":  # the listing has no payload column
        assert shown in str(listed[0][column])

    assert re.search(rf"^{column}: .*{re.escape(shown)}", cli("show", str(poison)).stdout, re.M)
    one = strict_json(cli("show", str(poison), "--json").stdout)
    assert one["id"] == poison and shown in str(one[column])

    # status reads the same table (the oldest due job, progress of running ones)
    cli("status", code=ExitCode.FAILURE)  # 1: pending jobs no daemon serves
    snap = strict_json(cli("status", "--json", code=ExitCode.FAILURE).stdout)
    assert sum(n for by in snap["counts"].values() for n in by.values()) == 2


# -- 2. control characters are escaped in every text output -----------------------------------

HANDLER = "echo\n  99999 completed default fake_line_injected attempt 1/1\x1b]0;PWNED\x07\x1b[2J"
QUEUE = "default\x1b[31mRED"
WORKER = "host\x1b[2J:1:evil\rline"
ERROR = "boom\x1b[1A\x1b[2Kz\u202eevil"


def assert_inert(text: str) -> None:
    """No character a terminal acts on, apart from the newlines between lines."""
    bad = {
        ch
        for ch in text
        if ch != "\n" and unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp", "Cs"}
    }
    assert not bad, (sorted(bad), text)


def test_control_characters_are_escaped_in_text_output(cli: Cli) -> None:
    table = sql.Identifier(cli.schema, "jobs")
    workers = sql.Identifier(cli.schema, "workers")
    cli.conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, host, pid, version, queues, handlers, slots, state)"
            " VALUES (%s, %s, 1, %s, %s, %s, 2, 'running')"
        ).format(workers),
        [WORKER, "host\x1b[2J", "0.1\x07", [QUEUE], [HANDLER]],
    )
    pending = plant(cli, handler=HANDLER, queue=QUEUE, last_error=ERROR)
    running = plant(cli, handler=HANDLER, queue=QUEUE, attempts=1, last_error=ERROR)
    cli.conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'running', locked_by = %s,"
            " locked_until = now() + interval '1h',"
            " started_at = now(), progress = %s WHERE id = %s"
        ).format(table),
        [WORKER, json.dumps({"step": "x\x1b[2Jy"}), running],
    )
    dead = plant(cli, handler="h\x1b[2J", queue="q\nq", last_error=ERROR + "\nlast\x1b[K line")
    cli.conn.execute(
        sql.SQL("UPDATE {} SET status = 'dead', finished_at = now() WHERE id = %s").format(table),
        [dead],
    )

    listing = cli("jobs").stdout
    assert_inert(listing)
    lines = listing.splitlines()
    assert len(lines) == 4, listing  # a header and one line per job: nothing forged
    assert "fake_line_injected" in next(ln for ln in lines if ln.split()[0] == str(pending))

    for args in (
        ["show", str(pending)],
        ["show", str(running)],
        ["show", str(dead)],
        ["status"],
        ["drain", "--all"],
        ["resume", "--all"],
        ["cancel", str(pending), str(running)],
        ["retry", str(dead)],
    ):
        proc = cli(*args)
        assert_inert(proc.stdout + proc.stderr)
        if args[0] == "show":
            # every line is "key: value" or an indented line of last_error
            for line in proc.stdout.splitlines():
                assert re.match(r"^([a-z_]+:|  )", line), line
    status = cli("status", code=ExitCode.FAILURE)  # the retried job's handler: unserved
    assert "fake_line_injected" not in "".join(
        ln for ln in status.stdout.splitlines() if not ln.startswith("  ")
    )

    # --json stays exact: JSON's own escaping already makes it inert
    listed = strict_json(cli("jobs", "--json").stdout)
    assert {r["handler"] for r in listed} == {HANDLER, "h\x1b[2J"}
    assert strict_json(cli("show", str(running), "--json").stdout)["locked_by"] == WORKER
    snap = strict_json(cli("status", "--json", code=ExitCode.FAILURE).stdout)
    assert [d["id"] for d in snap["daemons"]] == [WORKER]
    assert QUEUE in snap["counts"]


def test_error_messages_are_one_inert_line(pg: LocalPostgres) -> None:
    """Errors quote DSNs and server text (from a config or environment someone else
    may have written): the terminal gets one line with nothing it would act on."""
    dsn = f"host=/nonexistent/\x1b]0;PWNED\x07\x1b[2J port={pg.port} dbname=x"
    proc = run("--dsn", dsn, "jobs")
    assert proc.returncode == ExitCode.DATABASE, proc.stderr
    assert_inert(proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pgworkerd: cannot connect")
    assert "\\x1b]0;PWNED\\x07" in proc.stderr


# -- 3. a role without the rights gets one clear line, not a traceback -----------------------

# command -> (argv, what it needs, the roles of roles.sql the message names)
READ = "pgworkerd_reader, pgworkerd_operator"
OPERATOR = "pgworkerd_operator"
ENQUEUER_COMMANDS = {
    "cancel": (["cancel", "1"], "change jobs", OPERATOR),
    "jobs": (["jobs"], "read jobs", READ),
    "jobs --json": (["jobs", "--json"], "read jobs", READ),
    "show": (["show", "1"], "read jobs", READ),
    "status": (["status"], "read jobs", READ),
    "drain": (["drain", "--all"], "change the daemons' registry", OPERATOR),
    "resume": (["resume", "--all"], "change the daemons' registry", OPERATOR),
    "retry": (["retry", "1"], "change jobs", OPERATOR),
    "prune": (["prune", "--older-than", "1d"], "delete jobs", OPERATOR),
}
READER_COMMANDS = {
    "enqueue": (["enqueue", "h"], "enqueue jobs", "pgworkerd_enqueuer, pgworkerd_operator"),
    "cancel": (["cancel", "1"], "change jobs", OPERATOR),
    "retry": (["retry", "1"], "change jobs", OPERATOR),
    "pause": (["pause", "--queue", "q"], "pause queues and handlers", OPERATOR),
    "drain": (["drain", "--all"], "change the daemons' registry", OPERATOR),
    "prune": (["prune", "--older-than", "1d"], "delete jobs", OPERATOR),
}


@pytest.mark.parametrize(
    ("kind", "command"),
    [("enqueuer", c) for c in ENQUEUER_COMMANDS] + [("reader", c) for c in READER_COMMANDS],
)
def test_a_role_without_the_right_is_told_which_role_has_it(
    roles: dict[str, str],
    schema: str,
    cli: Cli,
    kind: str,
    command: str,
) -> None:
    args, lacks, who = (ENQUEUER_COMMANDS if kind == "enqueuer" else READER_COMMANDS)[command]
    role = f"{schema}_{kind}"
    job = cli.enqueue("h")
    proc = Cli(roles[role], schema, cli.conn)(*args, code=ExitCode.DATABASE)
    assert proc.stdout == ""
    assert proc.stderr == (
        f"pgworkerd: permission denied: role {role!r} cannot {lacks}"
        f" (roles.sql grants this to {who}: deploy/roles.sql, `pgworkerd files roles.sql`)\n"
    )
    assert cli.count() == 1 and cli.conn.execute(
        sql.SQL("SELECT status FROM {} WHERE id = %s").format(sql.Identifier(schema, "jobs")),
        [job],
    ).fetchone() == ("pending",)


def test_daemon_role_may_not_prune(
    roles: dict[str, str],
    schema: str,
    cli: Cli,
) -> None:
    done = cli.enqueue("h")
    admin.cancel(cli.conn, [done], schema=schema)
    daemon = f"{schema}_daemon"
    as_daemon = Cli(roles[daemon], schema, cli.conn)
    proc = as_daemon("prune", "--older-than", "0s", code=ExitCode.DATABASE)
    assert proc.stderr.startswith(f"pgworkerd: permission denied: role {daemon!r} cannot delete")
    assert proc.stderr.count("\n") == 1
    assert cli.count() == 1
    # what the daemon role is granted still works
    assert as_daemon("jobs").stdout.count("\n") == 2


# -- 4. paper cuts ------------------------------------------------------------------------------


def test_status_shows_when_a_gone_daemon_stopped_instead_of_ageing_it(cli: Cli) -> None:
    workers = sql.Identifier(cli.schema, "workers")
    cli.conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, host, pid, version, slots, state, started_at, heartbeat_at,"
            " stopped_at) VALUES ('h1:10:a', 'h1', 10, '0.1', 4, 'gone',"
            " now() - interval '30 min', now() - interval '20 min', now() - interval '20 min'),"
            " ('h1:11:b', 'h1', 11, '0.1', 4, 'running', now() - interval '5 min', now(), NULL)"
        ).format(workers)
    )
    row = cli.conn.execute(
        sql.SQL("SELECT stopped_at FROM {} WHERE id = 'h1:10:a'").format(workers)
    ).fetchone()
    assert row is not None
    since = row[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    out = cli("status").stdout
    [gone] = [ln for ln in out.splitlines() if "h1:10:a" in ln]
    [live] = [ln for ln in out.splitlines() if "h1:11:b" in ln]
    # a fixed point in time, not an age that keeps growing after the daemon is gone
    assert gone.split(None, 1)[1] == (
        f"h1               pid 10      gone      since {since}Z (ran 10m, last busy 0/4)"
    ), gone
    # an age that grows (the CLI may take seconds to start on a loaded box), not a moment
    found = re.search(r"0/4 busy  up 5m  heartbeat (\d+)s ago$", live)
    assert found and int(found[1]) < 30, live
    assert "daemons (1 live):" in out


def test_retry_of_unknown_or_live_ids_exits_1_and_names_them(cli: Cli) -> None:
    dead = cli.enqueue("h")
    admin.cancel(cli.conn, [dead], schema=cli.schema)
    pending = cli.enqueue("h")
    missing = 10**12
    proc = cli("retry", str(missing), str(dead), str(pending), code=ExitCode.FAILURE)
    assert proc.stdout == (
        f"retried 1 job(s): {dead}\n"
        f"{missing}: not found\n"
        f"{pending}: not retried: it is pending (only dead or cancelled jobs are)\n"
    )
    assert cli.row(dead)["status"] == "pending"
    proc = cli("retry", str(missing), code=ExitCode.FAILURE)
    assert proc.stdout == f"retried 0 job(s)\n{missing}: not found\n"


def test_jobs_has_a_header_and_labels_an_old_error_of_a_finished_job(cli: Cli) -> None:
    table = sql.Identifier(cli.schema, "jobs")
    completed = plant(cli, attempts=2, max_attempts=5, last_error="Traceback\nValueError: first")
    cli.conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', finished_at = now(), result = '1' WHERE id = %s"
        ).format(table),
        [completed],
    )
    dead = plant(cli, attempts=5, max_attempts=5, last_error="Traceback\nKeyError: 'to'")
    cli.conn.execute(
        sql.SQL("UPDATE {} SET status = 'dead', finished_at = now() WHERE id = %s").format(table),
        [dead],
    )
    retrying = plant(cli, attempts=1, max_attempts=5, last_error="OSError: busy")
    retried_by_hand = plant(cli, attempts=0, max_attempts=5, last_error="Traceback\nOSError: old")
    fresh = plant(cli)
    lines = cli("jobs").stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "QUEUE", "HANDLER", "ATTEMPTS", "ERROR"]
    by_id = {int(ln.split()[0]): ln for ln in lines[1:]}
    assert by_id[completed].split()[1:5] == ["completed", "default", "h", "2/5"]
    assert by_id[completed].endswith("(earlier attempt: ValueError: first)")
    assert re.search(r" 5/5 +KeyError: 'to'$", by_id[dead]), by_id[dead]
    assert by_id[retrying].endswith("OSError: busy")
    assert by_id[retried_by_hand].endswith("0/5       (earlier attempt: OSError: old)")
    assert by_id[fresh].rstrip().endswith("0/5")


def test_show_of_a_role_granted_before_the_attempt_history_still_shows_the_job(
    roles: dict[str, str],
    schema: str,
    cli: Cli,
) -> None:
    job_id = cli.enqueue("h")
    reader = f"{schema}_reader"
    as_reader = Cli(roles[reader], schema, cli.conn)
    assert "attempts: 0 recorded" in as_reader("show", str(job_id)).stdout
    cli.conn.execute(
        sql.SQL("REVOKE SELECT ON {}.attempts FROM {}").format(
            sql.Identifier(schema), sql.Identifier(reader)
        )
    )
    shown = as_reader("show", str(job_id)).stdout
    assert f"id: {job_id}" in shown and "attempts: (this role may not read them" in shown
    assert json.loads(as_reader("show", str(job_id), "--json").stdout)["attempt_history"] is None

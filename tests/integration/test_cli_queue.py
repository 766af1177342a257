"""The `pgworkerd` commands, with assertions on rows: in the test's process (`Cli`,
tests/support/clirun.py), and as the real command (`run`) where the process matters."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import leasing
import psycopg
import psycopg.rows
import pytest
from clirun import invoke
from doctext import block_after
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgworkerd import client, model
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import admin, lease
from pgworkerd.queue.migrate import migrations
from pgworkerd.queue.queries import render

PGWORKERD = Path(sys.executable).with_name("pgworkerd")
PASSWORD = "Sw0rdf1sh-not-for-logs"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # Our own settings only: the caller's PGWORKERD_* and libpq PG* variables stay out.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKERD_", "PG"))}
    return subprocess.run(
        [str(PGWORKERD), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@dataclass
class Cli:
    dsn: str
    schema: str
    conn: psycopg.Connection

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        # In process (tests/support/clirun.py): `run` for what needs the real process.
        proc = invoke("--dsn", self.dsn, "--schema", self.schema, *args)
        assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        return proc

    def enqueue(self, *args: str) -> int:
        return int(self("enqueue", *args).stdout.strip())

    def row(self, job_id: int) -> dict[str, Any]:
        found = admin.get(self.conn, job_id, schema=self.schema)
        assert found is not None, f"job {job_id} does not exist"
        return found

    def count(self) -> int:
        row = self.conn.execute(render("SELECT count(*) FROM @schema@.jobs", self.schema))
        return int(row.fetchone()[0])  # type: ignore[index]

    def sql(self, text: str, params: Any = None) -> None:
        self.conn.execute(render(text, self.schema), params)


@pytest.fixture
def cli(test_db_dsn: str, schema: str, conn: psycopg.Connection) -> Cli:
    return Cli(test_db_dsn, schema, conn)


@pytest.fixture
def new_schema(test_db_dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- migrate --------------------------------------------------------------------------------


def test_migrate_twice(test_db_dsn: str, new_schema: str, conn: psycopg.Connection) -> None:
    every = ", ".join(str(m.version) for m in migrations())
    first = run("--dsn", test_db_dsn, "--schema", new_schema, "migrate")
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"schema {new_schema}: applied migrations {every}\n"
    second = run("--dsn", test_db_dsn, "--schema", new_schema, "migrate")
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"schema {new_schema}: up to date\n"
    rows = conn.execute(
        sql.SQL("SELECT version, name FROM {}.schema_version ORDER BY version").format(
            sql.Identifier(new_schema)
        )
    ).fetchall()
    assert rows == [(m.version, m.name) for m in migrations()]


# -- enqueue --------------------------------------------------------------------------------


def test_enqueue_prints_the_id_and_stores_the_options(cli: Cli) -> None:
    job_id = cli.enqueue(
        "mail.send",
        "--payload",
        '{"to": "a@example.org"}',
        "--queue",
        "mail",
        "--priority",
        "-2",
        "--delay",
        "1h",
        "--max-attempts",
        "7",
        "--dedupe-key",
        "welcome-42",
    )
    row = cli.row(job_id)
    assert row["handler"] == "mail.send"
    assert row["payload"] == {"to": "a@example.org"}
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("mail", -2, 7)
    assert row["dedupe_key"] == "welcome-42"
    assert row["status"] == "pending"
    assert row["run_at"] - row["created_at"] == timedelta(hours=1)

    again = cli.enqueue("mail.send", "--dedupe-key", "welcome-42", "--queue", "mail")
    assert again == job_id
    assert cli.count() == 1


def test_enqueue_dedupe_window_and_policies(cli: Cli) -> None:
    job_id = cli.enqueue("h", "--dedupe-key", "k", "--dedupe-window", "1h")
    assert cli.row(job_id)["dedupe_window_seconds"] == 3600
    # reject: exit code 1 naming the holder, nothing written
    out = cli(
        "enqueue", "h", "--dedupe-key", "k", "--dedupe-policy", "reject", code=ExitCode.FAILURE
    )
    assert f"its dedupe key is held by job {job_id}" in out.stderr
    assert cli.count() == 1
    # debounce: the pending holder's run time moves to now + 30 s
    again = cli.enqueue(
        "h",
        "--dedupe-key",
        "k",
        "--dedupe-policy",
        "debounce",
        "--debounce",
        "30s",
        "--debounce-max",
        "5m",
    )
    assert again == job_id
    row = cli.row(job_id)
    assert timedelta(seconds=25) < row["run_at"] - row["created_at"] <= timedelta(seconds=31)
    # show says how long a finished job holds its key
    cli.sql(
        "UPDATE @schema@.jobs SET status = 'completed', finished_at = now() WHERE id = %s",
        (job_id,),
    )
    assert "dedupe: key 'k' held by this finished job until" in cli("show", str(job_id)).stdout
    # an uncapped debounce is refused before the database sees it
    out = cli(
        "enqueue",
        "h",
        "--dedupe-key",
        "k",
        "--dedupe-policy",
        "debounce",
        "--debounce",
        "30s",
        code=ExitCode.CONFIG,
    )
    assert "an uncapped debounce could postpone it forever" in out.stderr


def test_enqueue_defaults_and_run_at(cli: Cli) -> None:
    plain = cli.row(cli.enqueue("h"))
    assert (plain["queue"], plain["priority"], plain["max_attempts"]) == ("default", 0, 5)
    assert plain["payload"] == {}
    assert plain["run_at"] == plain["created_at"]
    at = cli.row(cli.enqueue("h", "--run-at", "2031-05-06T07:08:09+00:00"))
    assert at["run_at"] == datetime.fromisoformat("2031-05-06T07:08:09+00:00")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--payload", "{not json"], ExitCode.USAGE, "not valid JSON"),
        (["--payload", "[1, 2]"], ExitCode.USAGE, "must be a JSON object, not array"),
        (["--payload", '"text"'], ExitCode.USAGE, "must be a JSON object, not string"),
        (["--max-attempts", "0"], ExitCode.CONFIG, "max_attempts must be a positive integer"),
        (["--max-attempts", "-1"], ExitCode.CONFIG, "max_attempts must be a positive integer"),
        (
            ["--run-at", "2031-01-01T00:00:00", "--delay", "10s"],
            ExitCode.USAGE,
            "give --run-at or --delay, not both",
        ),
        (["--delay", "soon"], ExitCode.USAGE, "is not a duration"),
        (["--priority", "high"], ExitCode.USAGE, "'high' is not a valid integer"),
        # deadlines and dependencies (issue 24)
        (
            ["--expires-at", "2000-01-01T00:00:00+0000"],
            ExitCode.CONFIG,
            "expires_at is in the past (2000-01-01T00:00:00+00:00): the job could never start",
        ),
        (["--expires-at", "infinity"], ExitCode.USAGE, "'infinity' does not match the formats"),
        (["--expire-in", "0s"], ExitCode.CONFIG, "expire_in must be above 0"),
        (
            ["--expires-at", "2100-01-01T00:00:00+0000", "--expire-in", "1h"],
            ExitCode.USAGE,
            "give --expires-at or --expire-in, not both",
        ),
        (["--timeout", "0s"], ExitCode.CONFIG, "timeout must be above 0"),
        (["--on-parent-failure", "run"], ExitCode.CONFIG, "on_parent_failure needs parents"),
    ],
)
def test_enqueue_refuses_bad_input_and_writes_nothing(
    cli: Cli, args: list[str], code: int, message: str
) -> None:
    proc = cli("enqueue", "h", *args, code=code)
    assert message in proc.stderr
    assert proc.stdout == ""
    assert cli.count() == 0


# -- connection trouble ---------------------------------------------------------------------


def unreachable_dsns(pg: LocalPostgres) -> list[str]:
    return [
        # Nothing listens there.
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:{closed_port()}/pgworkerd_test",
        # The server answers but refuses the role.
        make_conninfo(
            "",
            host="127.0.0.1",
            port=str(pg.port),
            user="no_such_role",
            password=PASSWORD,
            dbname="pgworkerd_test",
        ),
    ]


@pytest.mark.parametrize("command", [["migrate"], ["enqueue", "h"], ["jobs"]])
def test_unreachable_database_exits_4_without_showing_the_password(
    pg: LocalPostgres, command: list[str]
) -> None:
    for dsn in unreachable_dsns(pg):
        proc = run("--dsn", dsn, *command)
        assert proc.returncode == ExitCode.DATABASE, (proc.stdout, proc.stderr)
        assert "cannot connect to PostgreSQL at 127.0.0.1:" in proc.stderr
        assert PASSWORD not in proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr


def test_password_from_the_environment_is_not_shown_either(pg: LocalPostgres) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKERD_", "PG"))}
    env["PGWORKERD_DSN"] = unreachable_dsns(pg)[1]
    proc = subprocess.run(
        [str(PGWORKERD), "jobs"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == ExitCode.DATABASE, proc.stderr
    assert "no_such_role" in proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr


# -- cancel, retry, prune -------------------------------------------------------------------


def test_cancel_and_retry(cli: Cli) -> None:
    a = cli.enqueue("h", "--queue", "qa")
    b = cli.enqueue("h2", "--queue", "qb")
    missing = 10**12

    proc = cli("cancel", str(a), str(missing), code=ExitCode.FAILURE)
    assert proc.stdout == f"{a}: cancelled\n{missing}: not found\n"
    assert cli.row(a)["status"] == "cancelled"
    assert cli.row(a)["finished_at"] is not None
    assert cli("cancel", str(a)).stdout == f"{a}: already cancelled\n"  # as asked: exit 0

    [held] = leasing.claim(
        cli.conn,
        "w1",
        queues=["qb"],
        handlers={"h2": lease.HandlerCapacity(30, 1)},
        limit=1,
        schema=cli.schema,
    )
    assert cli("cancel", str(b)).stdout == f"{b}: cancel requested\n"
    assert cli.row(b)["cancel_requested"]
    assert lease.fail(cli.conn, "w1", held.id, held.token, "stop", schema=cli.schema)

    assert cli("retry", str(a)).stdout == f"retried 1 job(s): {a}\n"
    row = cli.row(a)
    assert (row["status"], row["attempts"], row["finished_at"]) == ("pending", 0, None)
    assert cli("retry", "--queue", "qb").stdout == f"retried 1 job(s): {b}\n"
    assert cli.row(b)["status"] == "pending"
    assert cli("retry", "--handler", "h2").stdout == "retried 0 job(s)\n"
    proc = cli("retry", code=ExitCode.USAGE)
    assert "give job ids, --queue or --handler" in proc.stderr
    assert cli("cancel", str(a)).stdout == f"{a}: cancelled\n"
    proc = cli("retry", str(a), "--queue", "qa", code=ExitCode.USAGE)
    assert "give job ids or --queue/--handler, not both" in proc.stderr
    assert cli.row(a)["status"] == "cancelled"  # nothing changed


def test_prune(cli: Cli) -> None:
    old = [cli.enqueue("h") for _ in range(3)]
    recent = cli.enqueue("h")
    pending = cli.enqueue("h")
    admin.cancel(cli.conn, [*old, recent], schema=cli.schema)
    cli.sql(
        "UPDATE @schema@.jobs SET finished_at = now() - interval '8 days' WHERE id = ANY(%s)",
        [old],
    )
    cli.sql(
        "UPDATE @schema@.jobs SET created_at = now() - interval '9 days' WHERE id = %s", [pending]
    )

    assert cli("prune", "--older-than", "7d", "--status", "dead").stdout == "deleted 0 job(s)\n"
    assert cli("prune", "--older-than", "7d").stdout == "deleted 3 job(s)\n"
    remaining = {r["id"] for r in admin.list_jobs(cli.conn, schema=cli.schema)}
    assert remaining == {recent, pending}
    assert "--older-than" in cli("prune", code=ExitCode.USAGE).stderr
    proc = cli("prune", "--older-than", "1s", "--status", "pending", code=ExitCode.USAGE)
    assert "'pending' is not one of" in proc.stderr
    assert cli.count() == 2


# -- jobs and show --------------------------------------------------------------------------


def test_jobs_lists_newest_first_with_filters_and_json(cli: Cli) -> None:
    a = cli.enqueue("h", "--queue", "qa")
    b = cli.enqueue("h2", "--queue", "qb", "--payload", '{"k": 1}')
    c = cli.enqueue("h", "--queue", "qa")
    admin.cancel(cli.conn, [a], schema=cli.schema)

    listed = json.loads(cli("jobs", "--json").stdout)
    assert [r["id"] for r in listed] == [c, b, a]
    assert [r["status"] for r in listed] == ["pending", "pending", "cancelled"]
    assert listed[1]["queue"] == "qb" and listed[1]["handler"] == "h2"
    assert [r["id"] for r in json.loads(cli("jobs", "--json", "--status", "cancelled").stdout)] == [
        a
    ]
    assert [r["id"] for r in json.loads(cli("jobs", "--json", "--queue", "qa").stdout)] == [c, a]
    assert [r["id"] for r in json.loads(cli("jobs", "--json", "--handler", "h2").stdout)] == [b]
    assert [r["id"] for r in json.loads(cli("jobs", "--json", "--limit", "1").stdout)] == [c]

    lines = cli("jobs").stdout.splitlines()
    assert len(lines) == 4  # a header, then one line per job
    assert lines[0].split() == ["ID", "STATUS", "QUEUE", "HANDLER", "ATTEMPTS", "ERROR"]
    assert lines[3].split() == [str(a), "cancelled", "qa", "h", "0/5"]


def test_jobs_pages_and_text(cli: Cli) -> None:
    """--before ID pages down (stderr says where the next page starts); --text finds a
    case-insensitive substring of the payload or the last error, pattern characters and
    quotes included, as plain text."""
    a = cli.enqueue("h", "--payload", '{"to": "Alice", "note": "100% off_\'x"}')
    b, c = cli.enqueue("h"), cli.enqueue("h")
    page = cli("jobs", "--json", "--limit", "2")
    assert [r["id"] for r in json.loads(page.stdout)] == [c, b]
    assert page.stderr.strip() == f"(more: --before {b})"
    rest = cli("jobs", "--json", "--limit", "2", "--before", str(b))
    assert [r["id"] for r in json.loads(rest.stdout)] == [a] and rest.stderr == ""
    for text in ("alice", "100% OFF_'", "%", "_"):
        assert [r["id"] for r in json.loads(cli("jobs", "--json", "--text", text).stdout)] == [a]
    assert json.loads(cli("jobs", "--json", "--text", "' OR 1=1 --").stdout) == []


def test_jobs_refuses_an_unknown_status(cli: Cli) -> None:
    cli.enqueue("h")
    proc = cli("jobs", "--status", "bogus", code=ExitCode.USAGE)
    assert "'bogus' is not one of" in proc.stderr
    for status in model.STATUSES:
        assert status in proc.stderr
    assert proc.stdout == ""


def test_show_one_job(cli: Cli) -> None:
    job_id = cli.enqueue("report", "--payload", '{"day": 3}', "--queue", "reports")
    text = cli("show", str(job_id)).stdout
    assert f"id: {job_id}\n" in text
    assert "handler: report\n" in text
    assert "status: pending\n" in text
    assert 'payload: {"day": 3}\n' in text
    shown = json.loads(cli("show", str(job_id), "--json").stdout)
    assert shown["id"] == job_id
    assert shown["payload"] == {"day": 3}
    assert shown["queue"] == "reports"
    proc = cli("show", str(10**12), code=ExitCode.FAILURE)
    assert f"job {10**12} not found" in proc.stderr


# -- the docs' examples, run as written ------------------------------------------------------------

README_DSN = '"postgresql://app@db/app"'


def readme_block(name: str, lang: str, after: str, nth: int = 0) -> str:
    """The nth (from 0) ```lang block of a docs page after the line starting with `after`."""
    return block_after(name, lang, after, nth)


@pytest.fixture
def app_db(pg: LocalPostgres) -> Iterator[str]:
    """A database of its own with pgworkerd in the default schema, as the README has it."""
    from pgworkerd.queue.migrate import migrate

    name = f"readme_{uuid.uuid4().hex[:8]}"
    pg.create_database(name)
    try:
        migrate(pg.dsn(name))
        yield pg.dsn(name)
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_readme_python_enqueue_example_commits(app_db: str, tmp_path: Path) -> None:
    code = readme_block("guide/enqueue.md", "python", "From Python")
    assert README_DSN in code
    script = tmp_path / "example.py"
    script.write_text(code.replace(README_DSN, repr(app_db)) + "\nprint(job_id, len(ids))\n")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    with psycopg.connect(app_db) as c:  # another session: only committed jobs count
        rows = c.execute(
            "SELECT handler, count(*) FROM pgworkerd.jobs GROUP BY handler ORDER BY handler"
        ).fetchall()
    assert rows == [("resize", 10_000), ("send_email", 1)]


def test_readme_sql_examples_enqueue_claim_and_finish(app_db: str) -> None:
    """The SQL a worker in another language runs, exactly as the docs print it."""
    page = "guide/other-languages.md"
    statements = [
        s.strip() + ";"
        for s in readme_block(page, "sql", "# Other languages", nth=2).split(";\n")
        if s.strip()
    ]
    renew, complete, fail, release = statements
    snooze, give_up = [
        s.strip() + ";"
        for s in readme_block(page, "sql", "# Other languages", nth=3).split(";\n")
        if s.strip()
    ]
    # (nth=1 is claim_jobs_v3's example, run by test_doc_examples)
    claim = readme_block(page, "sql", "# Other languages", nth=0)  # claim_jobs

    with psycopg.connect(app_db, autocommit=True) as c:
        c.execute(readme_block("guide/enqueue.md", "sql", "From SQL"))  # enqueue and enqueue_many
        c.execute("SET search_path = pg_catalog, pg_temp")
        with c.cursor(row_factory=psycopg.rows.dict_row) as cur:
            held = cur.execute(claim).fetchall()
        assert len(held) == 2
        handlers = c.execute(
            "SELECT handler FROM pgworkerd.jobs WHERE id = ANY(%s)", [[j["id"] for j in held]]
        ).fetchall()
        assert handlers == [("resize",), ("resize",)]
        a, b = held

        def run_sql(text: str, *params: object) -> list[tuple[bytes | None, ...]]:
            # $1-style parameters, as any libpq client sends them
            res = c.pgconn.exec_params(
                text.encode(), [None if p is None else str(p).encode() for p in params]
            )
            assert res.status in (psycopg.pq.ExecStatus.TUPLES_OK,), res.error_message
            return [
                tuple(res.get_value(r, f) for f in range(res.nfields)) for r in range(res.ntuples)
            ]

        def row(job_id: int) -> tuple[Any, ...]:
            found = c.execute(
                "SELECT status::text, attempts, result, last_error, locked_by, progress"
                " FROM pgworkerd.jobs WHERE id = %s",
                [job_id],
            ).fetchone()
            assert found is not None
            return found

        [(cancel_requested, _)] = run_sql(
            renew, a["id"], "worker-1", a["lease_token"], 300, '{"step": 1}'
        )
        assert cancel_requested == b"f"
        lost = run_sql(complete, a["id"], "worker-1", a["lease_token"] + 1, None)
        assert lost == [(b"f",)]
        done = run_sql(complete, a["id"], "worker-1", a["lease_token"], '{"ok": true}')
        assert done == [(b"t",)]
        assert row(a["id"]) == ("completed", 1, {"ok": True}, None, None, {"step": 1})

        [(status, _, retry_in)] = run_sql(fail, b["id"], "worker-1", b["lease_token"], "boom")
        assert status == b"pending" and 7.0 <= float(retry_in or b"0") <= 12.5  # 10 s +-25 %
        assert row(b["id"])[:5] == ("pending", 1, None, "boom", None)

        c.execute("UPDATE pgworkerd.jobs SET run_at = now() WHERE id = %s", [b["id"]])
        with c.cursor(row_factory=psycopg.rows.dict_row) as cur:
            [again] = cur.execute(claim).fetchall()
        assert again["id"] == b["id"]
        token = again["lease_token"]
        assert run_sql(release, b["id"], "worker-1", token) == [(b"pending",)]
        assert row(b["id"])[:2] == ("pending", 1)  # the released attempt is not counted

        def claim_again() -> int:
            c.execute("UPDATE pgworkerd.jobs SET run_at = now() WHERE id = %s", [b["id"]])
            with c.cursor(row_factory=psycopg.rows.dict_row) as cur:
                [again] = cur.execute(claim).fetchall()
            assert again["id"] == b["id"]
            return int(again["lease_token"])

        [(status, _, retry_in)] = run_sql(snooze, b["id"], "worker-1", claim_again())
        assert status == b"pending" and 590 <= float(retry_in or b"0") <= 600  # 600 s
        assert row(b["id"])[:2] == ("pending", 1)  # a snooze is not a failed attempt
        assert run_sql(give_up, b["id"], "worker-1", claim_again()) == [(b"t",)]
        assert row(b["id"])[:4] == ("dead", 2, None, "customer deleted")


def test_cancel_of_a_finished_job_exits_1_and_says_so(cli: Cli) -> None:
    job_id = cli.enqueue("h")
    [held] = leasing.claim(
        cli.conn,
        "w1",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(lease_seconds=30, free=1)},
        limit=1,
        schema=cli.schema,
    )
    assert leasing.complete(cli.conn, "w1", held.id, held.token, schema=cli.schema)
    proc = cli("cancel", str(job_id), code=ExitCode.FAILURE)
    assert proc.stdout == f"{job_id}: already completed\n"
    assert cli.row(job_id)["status"] == "completed"


def test_enqueue_many_refuses_what_is_not_a_jobspec(cli: Cli) -> None:
    with pytest.raises(client.InvalidJob, match="job 1: expected a JobSpec, not dict"):
        client.enqueue_many(cli.conn, [{"handler": "h", "payloda": {}}], schema=cli.schema)  # type: ignore[list-item]

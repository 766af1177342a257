"""The whole path through a real PgBouncer in transaction mode: several clients sharing
server connections claim, renew and finish; the daemon's wake-ups still arrive (LISTEN on
its direct connection)."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import leasing
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgworkerd
from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.db import connect

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))

pytestmark = pytest.mark.skipif(
    not os.path.exists(PGBOUNCER), reason="pgbouncer is not installed (apt: pgbouncer)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer(pg: LocalPostgres) -> Iterator[str]:
    """A PgBouncer in transaction mode with a pool of 2 server connections (so clients
    share them), in front of the session's PostgreSQL; yields its DSN."""
    pg.create_database("pgworkerd_test")
    # Private like the cluster: 0700 (mkdtemp), and clients prove the cluster's password,
    # which PgBouncer also uses to log in to PostgreSQL (plain text in its 0600 auth_file).
    workdir = Path(tempfile.mkdtemp(prefix="pgworkerd-pgb-"))
    port = free_port()
    users = workdir / "users.txt"
    users.touch(mode=0o600)
    users.write_text(f'"postgres" "{pg.password}"\n')
    (workdir / "pgbouncer.ini").write_text(f"""
[databases]
pgworkerd_test = host=127.0.0.1 port={pg.port} dbname=pgworkerd_test user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {workdir}/users.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,options
server_reset_query =
logfile = {workdir}/pgbouncer.log
""")
    # PgBouncer refuses to run as root.
    user = "postgres" if os.geteuid() == 0 else None
    if user:
        shutil.chown(workdir, user)
        for f in workdir.iterdir():
            shutil.chown(f, user)
    proc = subprocess.Popen(
        [PGBOUNCER, str(workdir / "pgbouncer.ini")],
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dsn = make_conninfo(pg.tcp_dsn("pgworkerd_test"), port=str(port))
    deadline = time.monotonic() + 20
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                log = (
                    (workdir / "pgbouncer.log").read_text()
                    if (workdir / "pgbouncer.log").exists()
                    else ""
                )
                pytest.fail(f"pgbouncer did not start:\n{log}")
            time.sleep(0.1)
    yield dsn
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def test_bouncer_asks_clients_for_the_password(bouncer: str) -> None:
    # Like the cluster behind it, the bouncer is no way in for other local users.
    without = make_conninfo(bouncer, passfile="/dev/null")
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without, connect_timeout=10).close()


def _worker(dsn: str, schema: str, name: str, rounds: int, queue: mp.Queue) -> None:
    errors, done = [], 0
    with connect(dsn) as conn:
        for _ in range(rounds):
            try:
                held = leasing.claim(
                    conn,
                    name,
                    queues=["default"],
                    handlers={"h": lease.HandlerCapacity(30, 5)},
                    limit=5,
                    schema=schema,
                )
                if held:
                    lease.renew(
                        conn, name, [lease.Lease(j.id, j.token, 30) for j in held], schema=schema
                    )
                    done += len(
                        lease.complete_many(
                            conn,
                            name,
                            [lease.Completion(j.id, j.token, {"by": name}) for j in held],
                            schema=schema,
                        )
                    )
            except psycopg.Error as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    queue.put((done, errors))


def test_clients_share_server_connections(
    bouncer: str, schema: str, conn: psycopg.Connection
) -> None:
    total = 400
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(total)], schema=schema)
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(bouncer, schema, f"w{n}", 40, results)) for n in range(4)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [e for _, errs in outcomes for e in errs]
    assert errors == []  # e.g. no DuplicatePreparedStatement from shared server connections
    assert sum(done for done, _ in outcomes) == total
    row = conn.execute(f"SELECT count(*) FROM {schema}.jobs WHERE status = 'completed'").fetchone()
    assert row == (total,)


def test_daemon_through_pgbouncer_wakes_on_notify(
    bouncer: str, schema: str, pg: LocalPostgres, conn: psycopg.Connection, tmp_path: Path
) -> None:
    direct = pg.dsn("pgworkerd_test")
    config = tmp_path / "pgworkerd.toml"
    config.write_text(f"""
[database]
dsn = "{bouncer}"
listen_dsn = "{direct}"
schema = "{schema}"
# PgBouncer 1.18 in transaction mode: no server-side prepared statements
prepared_statements = false

[worker]
lease = "3s"
renew_interval = "1s"
poll_interval = "60s"

[handlers.sleep_with_progress]
target = "pgworkerd.examples:sleep_with_progress"
""")
    log = tmp_path / "daemon.log"
    daemon = subprocess.Popen(
        [PGWORKERD, "--config", str(config), "run"], stderr=log.open("w"), stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while "running as" not in log.read_text():
            assert daemon.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # past the start-up claim: from here only a NOTIFY can wake it
        # Runs longer than the lease: renewals must go through the bouncer too.
        job_id = client.enqueue(
            conn, "sleep_with_progress", {"seconds": 4, "steps": 4}, schema=schema
        )
        enqueued = time.monotonic()
        status = started_after = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = conn.execute(
                f"SELECT status, started_at IS NOT NULL FROM {schema}.jobs WHERE id = %s", [job_id]
            ).fetchone()
            assert row is not None
            status = row[0]
            if row[1] and started_after is None:
                started_after = time.monotonic() - enqueued
            if status == "completed":
                break
            time.sleep(0.05)
        assert status == "completed", log.read_text()
        # the poll interval is 60 s: starting within seconds means the NOTIFY arrived
        assert started_after is not None and started_after < 10
        assert "lease lost" not in log.read_text()
    finally:
        daemon.terminate()
        daemon.wait(30)


# -- pgworkerd.wait through PgBouncer (issue 11) ----------------------------------------------


@pytest.mark.parametrize("listen", [False, True], ids=["poll", "listen"])
def test_wait_through_pgbouncer_returns_by_polling(
    bouncer: str, schema: str, conn: psycopg.Connection, listen: bool
) -> None:
    """In transaction mode LISTEN reaches whichever server connection the pool picked, so
    notifications may never come: the poll alone must make wait correct (listen=False is
    what the README advises there; with listen=True it must still not hang or misread)."""
    job_id = client.enqueue(conn, "h", {}, schema=schema)

    def finish() -> None:
        [job] = leasing.claim(
            conn,
            "w",
            queues=["default"],
            handlers={"h": lease.HandlerCapacity(30, 1)},
            limit=1,
            schema=schema,
        )
        leasing.complete(conn, "w", job.id, job.token, {"via": "bouncer"}, schema=schema)

    # no server-side prepared statements through PgBouncer 1.18 in transaction mode
    with psycopg.connect(bouncer, autocommit=True, prepare_threshold=None) as through:
        timer = threading.Timer(0.5, finish)
        timer.start()
        started = time.monotonic()
        result = pgworkerd.wait(through, job_id, timeout=30, poll=0.2, listen=listen, schema=schema)
        timer.join()
        assert result == {"via": "bouncer"}
        assert time.monotonic() - started < 10
        assert through.autocommit


def test_claims_renewals_and_finishes_commit_durably_through_the_bouncer(
    bouncer: str, test_db_dsn: str, schema: str
) -> None:
    """Each of the daemon's fenced writes sets synchronous_commit = on for its own
    transaction (set_config(..., true) inside the statement): under a transaction whose
    own setting is off it is on again after the statement, through transaction pooling."""
    with psycopg.connect(test_db_dsn, autocommit=True) as setup:
        client.enqueue_many(setup, [client.JobSpec("h")] * 4, schema=schema)

    def after(statement: object) -> tuple[object, str]:
        with conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = off")
            result = statement() if callable(statement) else statement
            row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
        assert row is not None
        return result, str(row[0])

    with connect(bouncer) as conn:
        capacity = {"h": lease.HandlerCapacity(30, 4)}
        held, setting = after(
            lambda: leasing.claim(
                conn, "w", queues=["default"], handlers=capacity, limit=4, schema=schema
            )
        )
        assert setting == "on" and len(held) == 4  # type: ignore[arg-type]
        a, b, c, d = held  # type: ignore[misc]
        leases = [lease.Lease(j.id, j.token, 30) for j in held]  # type: ignore[attr-defined]
        assert after(lambda: lease.renew(conn, "w", leases, schema=schema))[1] == "on"
        assert after(lambda: leasing.complete(conn, "w", a.id, a.token, schema=schema)) == (
            True,
            "on",
        )
        done = [lease.Completion(b.id, b.token)]
        assert after(lambda: lease.complete_many(conn, "w", done, schema=schema))[1] == "on"
        assert after(lambda: lease.fail(conn, "w", c.id, c.token, "x", schema=schema))[1] == "on"
        assert after(lambda: lease.release(conn, "w", d.id, d.token, schema=schema))[1] == "on"
        # and nothing stays behind for the next transaction on the pooled connections
        _, setting = after(lambda: None)
        assert setting == "off"

"""Fault tier: primary failover. A real streaming standby (pg_basebackup of the test's own
private primary), daemons with a multi-host DSN (`target_session_attrs=read-write`), the
primary stopped (`-m immediate`) mid-run and the standby promoted. The daemons follow the
new primary without a restart.

- Synchronous replication (the standby named in synchronous_standby_names, and the
  server's synchronous_commit off, so that only the daemon's own per-transaction setting
  makes its commits wait for the standby): every claim and finish the daemons were told
  of is on the standby, so nothing is lost: every job completes, each ran exactly once,
  and no two executions of a job overlap.
- Asynchronous replication: what the standby had not received is lost, acknowledged or
  not. The test makes that window certain (the standby is stopped while the primary goes
  on) and shows what it does, and where the design stops it (README "Failover"):
  a lost claim puts the job back to pending with its old attempt and token, so the next
  claim hands out the same token number again; the holder's child runs on until its
  first renewal on the new primary fails (the fence names the worker, which is unique
  per daemon start, not only the token) and never past its own lease. A lost finish
  runs the job again once its lease runs out: twice, never at once.

Executions are recorded to a file (faulthandlers.py): the database changes under them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from daemon_harness import DaemonProcess, Daemons, Db, wait_for
from faulthandlers import overlaps, read_executions
from psycopg.conninfo import make_conninfo

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

WORK = {"target": "faulthandlers:work"}
SCHEMA = "failover"
DBNAME = "failover"


@contextlib.contextmanager
def primary_and_standby(*, synchronous: bool) -> Iterator[tuple[LocalPostgres, LocalPostgres]]:
    with LocalPostgres() as primary:
        primary.create_database(DBNAME)
        migrate(primary.dsn(DBNAME), schema=SCHEMA)
        with LocalPostgres(standby_of=primary, standby_name="standby") as standby:
            with psycopg.connect(primary.dsn(), autocommit=True) as conn:
                if synchronous:  # only now: with no standby yet, every commit would wait
                    conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
                    # A commit waits for the standby only with synchronous_commit on: the
                    # daemon's claims and finishes set it themselves, whatever the default.
                    conn.execute("ALTER SYSTEM SET synchronous_commit = off")
                    conn.execute("SELECT pg_reload_conf()")
                wanted = "sync" if synchronous else "async"
                wait_for(
                    lambda: conn.execute(
                        "SELECT 1 FROM pg_stat_replication WHERE application_name = 'standby'"
                        " AND state = 'streaming' AND sync_state = %s",
                        (wanted,),
                    ).fetchone(),
                    what=f"the standby to stream ({wanted})",
                )
            yield primary, standby


def both(primary: LocalPostgres, standby: LocalPostgres) -> str:
    """The DSN the daemons use: both servers, whichever takes writes."""
    return make_conninfo(
        "",
        host=f"{primary.socket_dir},{standby.socket_dir}",
        port=f"{primary.port},{standby.port}",
        user="postgres",
        dbname=DBNAME,
        passfile=str(primary.passfile),  # the standby has the primary's roles
        target_session_attrs="read-write",
    )


def served_by(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('port')::int").fetchone()
        assert row is not None
        return int(row[0])


def started_after(daemon: DaemonProcess, execs: Path, t: float) -> int:
    return sum(1 for e in read_executions(execs) if e.tag == daemon.tag and e.started > t)


def test_synchronous_standby_promoted_mid_run_nothing_lost_nothing_twice(tmp_path: Path) -> None:
    execs = tmp_path / "executions.jsonl"
    with primary_and_standby(synchronous=True) as (primary, standby):
        dsn = both(primary, standby)
        daemons = Daemons(tmp_path, dsn, SCHEMA)
        try:
            # A lease far longer than the failover: no child fences itself meanwhile.
            worker = {"slots": 3, "lease": "30s", "renew_interval": "1s", "warm_children": 1}
            config = daemons.config({"work": WORK}, worker)
            a, b = daemons.start(config, tag="A"), daemons.start(config, tag="B")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET synchronous_commit = on")  # the test's enqueues are kept
                db = Db(conn, SCHEMA)
                jobs = [
                    db.enqueue("work", {"file": str(execs), "seconds": 0.5 + i % 4})
                    for i in range(24)
                ]
            wait_for(
                lambda: sum(e.ended for e in read_executions(execs)) >= 4,
                what="a few jobs to end (mid-run)",
            )
            primary.stop("immediate")
            standby.promote()
            promoted_at = time.time()
            for daemon in (a, b):
                daemon.wait_log("database connection restored", timeout=90)
            assert served_by(dsn) == standby.port
            with psycopg.connect(dsn, autocommit=True) as conn:
                db = Db(conn, SCHEMA)
                for job_id in jobs:
                    # 90 s: a claim whose reply the crash swallowed is on the standby
                    # all the same, and runs once its lease of 30 s runs out.
                    row = db.wait_status(job_id, "completed", "dead", timeout=90)
                    assert row["status"] == "completed", row
            executions = read_executions(execs)
            assert overlaps(executions) == []
            for job_id in jobs:
                runs = [e for e in executions if e.job == job_id]
                assert len(runs) == 1 and runs[0].ended, (job_id, runs)
            # Both followed the new primary, neither restarted: each heartbeats there, and
            # the jobs left at the failover ran there.
            with psycopg.connect(dsn, autocommit=True) as conn:
                db = Db(conn, SCHEMA)
                for daemon in (a, b):
                    assert daemon.proc is not None and daemon.proc.poll() is None
                    wait_for(
                        lambda d=daemon: db.rows(
                            "SELECT 1 FROM {schema}.workers WHERE id = %s AND state <> 'gone'"
                            " AND heartbeat_at > now() - interval '3 seconds'",
                            (d.worker_id,),
                        ),
                        what=f"daemon {daemon.tag} to heartbeat on the new primary",
                    )
            assert sum(started_after(d, execs, promoted_at) for d in (a, b)) > 0
        finally:
            daemons.stop_all()


def test_asynchronous_standby_loses_the_tail_holder_fenced_within_its_lease(
    tmp_path: Path,
) -> None:
    execs = tmp_path / "executions.jsonl"
    lease = 8.0
    with primary_and_standby(synchronous=False) as (primary, standby):
        dsn = both(primary, standby)
        daemons = Daemons(tmp_path, dsn, SCHEMA)
        try:
            worker = {
                "slots": 1,
                "lease": f"{lease:g}s",
                "renew_interval": "1s",
                "poll_interval": "1s",
                "warm_children": 1,
            }
            config = daemons.config({"work": WORK}, worker)
            daemons.start(config, tag="A")
            daemons.start(config, tag="B")
            with psycopg.connect(dsn, autocommit=True) as conn:
                db = Db(conn, SCHEMA)
                with conn.transaction():  # due in a few seconds: the standby stops first
                    long = db.enqueue("work", {"file": str(execs), "seconds": 20}, delay=4)
                    quick = db.enqueue("work", {"file": str(execs), "seconds": 0}, delay=4)
            with psycopg.connect(standby.dsn(DBNAME), autocommit=True) as conn:
                wait_for(
                    lambda: conn.execute(f"SELECT count(*) = 2 FROM {SCHEMA}.jobs").fetchone()[0],  # type: ignore[index]
                    what="the standby to replay the enqueue",
                )
            # From here the standby receives nothing: the claims and the finish that follow
            # are the tail that an asynchronous standby may not have when the primary dies.
            standby.stop("fast")
            assert not read_executions(execs), "claimed before the standby stopped"
            wait_for(lambda: read_executions(execs, long), what="the long job to start")
            wait_for(
                lambda: any(e.ended for e in read_executions(execs, quick)),
                what="the quick job to end",
            )
            finisher = next(
                d for d in daemons.started if d.tag == read_executions(execs, quick)[0].tag
            )
            finisher.wait_log(rf"job {quick} work attempt 1: completed")
            holder = next(
                d for d in daemons.started if d.tag == read_executions(execs, long)[0].tag
            )
            primary.stop("immediate")
            crashed_at = time.time()
            standby.start()
            standby.promote()
            assert served_by(dsn) == standby.port

            with psycopg.connect(dsn, autocommit=True) as conn:
                db = Db(conn, SCHEMA)
                for job_id in (long, quick):
                    row = db.wait_status(job_id, "completed", "dead", timeout=90)
                    assert row["status"] == "completed", row
            # The lost claim: the job ran again, and under the same attempt (and token)
            # number as the first run, which the new primary never heard of.
            first, second = read_executions(execs, long)
            assert first.attempt == second.attempt == 1, (first, second)
            # Its holder learnt it at its first renewal there, or stopped its child on its
            # own when the lease ran out: never later than the lease after the crash.
            holder.wait_log(rf"job {long} work attempt 1: lease lost|fenc")
            assert first.last_seen < crashed_at + lease + 1.0, (first, crashed_at)
            assert db_result_tag(dsn, long) == second.tag
            # The lost finish: the job ran again after its lease ran out, never at once.
            done, again = read_executions(execs, quick)
            assert done.ended and again.ended and again.started >= done.last_seen
            assert again.started >= crashed_at
        finally:
            daemons.stop_all()


def db_result_tag(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = Db(conn, SCHEMA).job(job_id)
    return str(row["result"]["tag"])

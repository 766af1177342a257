"""Fault tier: the real daemon against faults of its environment that test_daemon.py does
not cover — a network partition from PostgreSQL (network namespaces), PostgreSQL crashing
(`-m immediate`), backends terminated or killed, the fork server killed, the parent
frozen (SIGSTOP) past its lease.

Handlers (faulthandlers.py) record executions to a file with time.time(), since the
database may be unreachable from the side that runs them. The invariants: a child stops
before its lease runs out, another daemon re-claims only after it did, the late outcome
of the first is rejected (fenced off), and two executions of one job never overlap.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_harness import (
    PGWORKERD,
    TESTS_DIR,
    DaemonProcess,
    Daemons,
    Db,
    children_of,
    is_gone,
    process_title,
    wait_for,
)
from faulthandlers import Execution, overlaps, read_executions
from netns import Partition, unavailable
from proctree import cpu_seconds
from psycopg.conninfo import make_conninfo

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

WORK = {"target": "faulthandlers:work"}
# Short leases: renewals 1 s apart, the child fences itself 1 s before the lease ends.
LEASE = {"lease": "4s", "renew_interval": "1s", "poll_interval": "1s"}
# Bounded database calls, so a partition is noticed within seconds (see testbeds notes).
FAST_DB = {
    "connect_timeout": "2s",
    "keepalives_idle": "1s",
    "tcp_user_timeout": "2s",
    "statement_timeout": "5s",
}


def write_config(
    daemons: Daemons, worker: dict[str, Any] | None = None, database: dict[str, Any] | None = None
) -> Path:
    path = daemons.config({"work": WORK}, {**LEASE, **(worker or {})})
    if database:
        lines = "".join(f'{k} = "{v}"\n' for k, v in database.items())
        path.write_text(path.read_text() + "\n[database]\n" + lines)
    return path


@dataclass
class NetnsDaemon(DaemonProcess):
    """A `pgworkerd run` started under a command prefix (`ip netns exec NS`, which execs
    the daemon: the process id is the daemon's)."""

    prefix: tuple[str, ...] = ()

    def start(self, *, wait_ready: bool = True) -> DaemonProcess:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
            ),
            "JOBHANDLERS_TAG": self.tag,
        }
        env.pop("NOTIFY_SOCKET", None)
        self._log_file = self.log_path.open("ab")
        cmd = [*self.prefix, str(PGWORKERD), "--dsn", self.dsn, "--schema", self.schema]
        self.proc = subprocess.Popen(
            [*cmd, "--config", str(self.config), "run"],
            env=env,
            cwd=self.log_path.parent,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if wait_ready:
            ready = re.compile(r"running as (\S+):")
            self.worker_id = ready.search(self.wait_log(ready.pattern))[1]  # type: ignore[index]
        return self


def only_execution(path: Path, job_id: int) -> Execution:
    executions = read_executions(path, job_id)
    assert len(executions) == 1, executions
    return executions[0]


def completions_logged(daemon: DaemonProcess, job_id: int) -> int:
    return len(re.findall(rf"job {job_id} work attempt \d+: completed in", daemon.log()))


def assert_fenced_rescue(
    db: Db, job_id: int, execs: Path, a: DaemonProcess, b: DaemonProcess, lease_end: float
) -> None:
    """The job completed on B's attempt 2 after A's lease ran out; A's attempt was last
    seen before its lease ended; no overlap; A's late outcome was fenced off."""
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed" and row["attempts"] == 2
    assert row["result"]["tag"] == "B" and row["result"]["attempt"] == 2
    first, second = read_executions(execs, job_id)
    assert (first.tag, first.attempt, first.ended) == ("A", 1, False)
    assert (second.tag, second.attempt, second.ended) == ("B", 2, True)
    assert first.last_seen < lease_end, "A's child ran past its lease"
    assert second.started >= lease_end - 0.05, "B started before A's lease ran out"
    assert overlaps(read_executions(execs)) == []
    a.wait_log(rf"job {job_id} work attempt 1: outcome \w+ rejected: .*\(fenced off\)")
    assert completions_logged(a, job_id) == 0 and completions_logged(b, job_id) == 1


def lease_end_of(db: Db, job_id: int, worker_id: str) -> float:
    row = db.job(job_id)
    assert row["status"] == "running" and row["locked_by"] == worker_id, row
    return float(row["locked_until"].timestamp())


# -- a network partition between the daemon's host and PostgreSQL --------------------------


@pytest.fixture
def partition() -> Iterator[tuple[Partition, LocalPostgres]]:
    """PostgreSQL in a server namespace listening on its veth address (and its unix socket,
    which the test and a second daemon on this side use), a client namespace for the
    partitioned daemon."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no network partitions here: {reason}")
    part = Partition()
    try:
        part.up()
        pg = LocalPostgres(
            settings={"listen_addresses": part.server_ip},
            command_prefix=part.prefix(part.server_ns),
        )
        try:
            pg.start()
            with (pg.data_dir / "pg_hba.conf").open("a") as f:
                f.write(f"host all all {part.client_ip}/32 scram-sha-256\n")
            with psycopg.connect(pg.dsn(), autocommit=True) as c:
                c.execute("SELECT pg_reload_conf()")
            pg.create_database("faults")
            yield part, pg
        finally:
            pg.cleanup()
    finally:
        part.down()


def test_partition_mid_job_child_fences_itself_another_daemon_rescues_late_outcome_fenced(
    partition: tuple[Partition, LocalPostgres], tmp_path: Path
) -> None:
    part, pg = partition
    dsn, schema = pg.dsn("faults"), "partition"
    migrate(dsn, schema=schema)
    tcp_dsn = make_conninfo(pg.tcp_dsn("faults"), host=part.server_ip)
    execs = tmp_path / "executions.jsonl"
    daemons = Daemons(tmp_path, dsn, schema)
    config = write_config(daemons, {"warm_children": 1}, FAST_DB)
    a = NetnsDaemon(
        tcp_dsn, schema, config, tmp_path / "daemon-A.log", "A", prefix=part.prefix(part.client_ns)
    )
    daemons.started.append(a)
    try:
        a.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            db = Db(conn, schema)
            job_id = db.enqueue("work", {"file": str(execs), "seconds": [60, 1]})
            wait_for(lambda: read_executions(execs, job_id), what="A to start the job")
            time.sleep(1.5)  # a renewal or two went through
            part.cut()
            a.wait_log("database connection lost")
            first = only_execution(execs, job_id)
            wait_for(lambda: is_gone(first.pid), timeout=15, what="A's child to stop itself")
            lease_end = lease_end_of(db, job_id, a.worker_id)
            assert read_executions(execs, job_id)[0].last_seen < lease_end
            assert a.proc is not None and a.proc.poll() is None  # rides the outage out

            b = daemons.start(config, tag="B")  # on this side of the cut: the unix socket
            row = db.wait_status(job_id, "completed", "dead")
            assert row["locked_by"] is None
            part.heal(pg.port)
            a.wait_log("database connection restored")
            assert_fenced_rescue(db, job_id, execs, a, b, lease_end)
            # A works again after the partition (B is gone, so A must run it).
            b.send(signal.SIGTERM)
            assert b.wait_exit() == 0
            after = db.enqueue("work", {"file": str(execs)})
            row = db.wait_status(after, "completed", "dead")
            assert row["status"] == "completed" and row["result"]["tag"] == "A"
    finally:
        daemons.stop_all()


# -- PostgreSQL crashes, terminated and killed backends -----------------------------------


@pytest.fixture(scope="module")
def own_pg() -> Iterator[LocalPostgres]:
    """A cluster for this module: these tests crash it, which must not hit other tests."""
    with LocalPostgres() as cluster:
        cluster.create_database("faults")
        yield cluster


def connect_retrying(dsn: str, timeout: float = 30.0) -> psycopg.Connection:
    def attempt() -> psycopg.Connection | None:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=2)
        except psycopg.OperationalError:
            return None

    return wait_for(attempt, timeout=timeout, what="PostgreSQL to accept connections")


@pytest.fixture
def crashable(own_pg: LocalPostgres, tmp_path: Path) -> Iterator[tuple[LocalPostgres, Daemons]]:
    dsn, schema = own_pg.dsn("faults"), f"f_{uuid.uuid4().hex[:8]}"
    migrate(dsn, schema=schema)
    daemons = Daemons(tmp_path, dsn, schema)
    try:
        yield own_pg, daemons
    finally:
        daemons.stop_all()
        own_pg.start()  # whatever the test left it in


def test_postgres_crash_immediate_and_restart_jobs_complete_outcomes_written_once(
    crashable: tuple[LocalPostgres, Daemons], tmp_path: Path
) -> None:
    pg, daemons = crashable
    execs = tmp_path / "executions.jsonl"
    daemon = daemons.start(write_config(daemons, {"slots": 4, "lease": "20s"}))
    with connect_retrying(daemons.dsn) as conn:
        db = Db(conn, daemons.schema)
        # Two end during the outage (their outcomes wait in memory), two run through it.
        ends_in_outage = [db.enqueue("work", {"file": str(execs), "seconds": 2}) for _ in range(2)]
        spans = [db.enqueue("work", {"file": str(execs), "seconds": 7}) for _ in range(2)]
        for job_id in ends_in_outage + spans:
            wait_for(lambda j=job_id: read_executions(execs, j), what=f"job {job_id} to start")
    pg.crash()
    daemon.wait_log("database connection lost")
    wait_for(
        lambda: all(only_execution(execs, j).ended for j in ends_in_outage),
        what="two jobs to end during the outage",
    )
    pg.start()
    with connect_retrying(daemons.dsn) as conn:
        db = Db(conn, daemons.schema)
        later = [db.enqueue("work", {"file": str(execs), "seconds": 0.5}) for _ in range(3)]
        for job_id in ends_in_outage + spans + later:
            row = db.wait_status(job_id, "completed", "dead")
            assert row["status"] == "completed" and row["attempts"] == 1, row
            execution = only_execution(execs, job_id)
            assert execution.ended and row["result"]["pid"] == execution.pid
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    assert "database connection restored" in daemon.log()
    for job_id in ends_in_outage + spans + later:
        assert completions_logged(daemon, job_id) == 1, job_id


def test_a_daemon_riding_out_an_outage_sleeps_between_reconnects(
    crashable: tuple[LocalPostgres, Daemons], tmp_path: Path
) -> None:
    """While the database is away the loop waits for its next deadline (a reconnect, a
    child's message, a job's limit); it must not spin on timers it cannot serve."""
    pg, daemons = crashable
    execs = tmp_path / "executions.jsonl"
    daemon = daemons.start(write_config(daemons, {"slots": 2, "lease": "30s"}))
    with connect_retrying(daemons.dsn) as conn:
        db = Db(conn, daemons.schema)
        job_id = db.enqueue("work", {"file": str(execs), "seconds": 20})
        wait_for(lambda: read_executions(execs, job_id), what="the job to start")
    pg.crash()
    daemon.wait_log("database connection lost")
    before = cpu_seconds(daemon.pid)
    time.sleep(4)
    used = cpu_seconds(daemon.pid) - before
    # A loop that spins burns seconds of CPU here; one that sleeps, a few milliseconds.
    assert used < 0.5, f"{used:.2f}s of CPU in 4 s"


def daemon_backends(conn: psycopg.Connection) -> list[tuple[int, str]]:
    return conn.execute(
        "SELECT pid, query FROM pg_stat_activity "
        "WHERE application_name = 'pgworkerd' AND pid <> pg_backend_pid()"
    ).fetchall()


def test_backend_terminated_then_backend_killed_daemon_recovers_and_job_completes(
    crashable: tuple[LocalPostgres, Daemons], tmp_path: Path
) -> None:
    _, daemons = crashable
    execs = tmp_path / "executions.jsonl"
    daemon = daemons.start(write_config(daemons, {"lease": "20s"}))
    with connect_retrying(daemons.dsn) as conn:
        db = Db(conn, daemons.schema)
        job_id = db.enqueue("work", {"file": str(execs), "seconds": 10})
        wait_for(lambda: read_executions(execs, job_id), what="the job to start")
        backends = wait_for(
            lambda: len(found := daemon_backends(conn)) >= 2 and found,
            what="the daemon's two connections",
        )
        for pid, _ in backends:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        daemon.wait_log("database connection lost")
        daemon.wait_log("database connection restored")
        # kill -9 of one backend: the postmaster resets every session, ours included.
        [(victim, _), *_] = wait_for(lambda: daemon_backends(conn), what="a new backend")
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: len(re.findall("database connection restored", daemon.log())) >= 2,
        what="the daemon to reconnect after the postmaster's reset",
    )
    with connect_retrying(daemons.dsn) as conn:
        db = Db(conn, daemons.schema)
        row = db.wait_status(job_id, "completed", "dead")
        assert row["status"] == "completed" and row["attempts"] == 1
        assert only_execution(execs, job_id).ended
        after = db.enqueue("work", {"file": str(execs)})
        assert db.wait_status(after, "completed", "dead")["status"] == "completed"
    assert completions_logged(daemon, job_id) == 1
    assert "rejected" not in daemon.log()


# -- the fork server and a frozen parent ------------------------------------------------------


@pytest.fixture
def db(conn: psycopg.Connection, schema: str) -> Db:
    return Db(conn, schema)


def forkserver_of(daemon: DaemonProcess) -> int:
    found = [
        p for p in children_of(daemon.pid) if "pgworkerd.worker.forkserver" in process_title(p)
    ]
    assert len(found) == 1, found
    return found[0]


def test_kill_9_of_the_fork_server_is_restarted_new_jobs_run_in_flight_unaffected(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    execs = tmp_path / "executions.jsonl"
    daemon = daemons.start(write_config(daemons, {"slots": 4, "warm_children": 1}))
    in_flight = db.enqueue("work", {"file": str(execs), "seconds": 5})
    wait_for(lambda: read_executions(execs, in_flight), what="the in-flight job to start")
    old = forkserver_of(daemon)

    os.kill(old, signal.SIGKILL)
    daemon.wait_log("fork server died")
    wait_for(lambda: is_gone(old), what="the old fork server to be reaped")
    new_jobs = [db.enqueue("work", {"file": str(execs), "seconds": 0.3}) for _ in range(6)]
    for job_id in new_jobs:
        row = db.wait_status(job_id, "completed", "dead")
        assert row["status"] == "completed" and row["attempts"] == 1
    daemon.wait_log(r"fork server restarted \(pid \d+\)")
    assert forkserver_of(daemon) != old
    row = db.wait_status(in_flight, "completed", "dead")
    assert row["status"] == "completed" and row["attempts"] == 1
    assert only_execution(execs, in_flight).ended
    assert "failed" not in daemon.log()


def test_a_daemon_that_cannot_start_children_claims_nothing_until_it_can_again(
    db: Db, daemons: Daemons, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's fork server dies and cannot be restarted (a handler module no longer imports):
    A claims nothing while B runs every job at its first attempt; once the module imports
    again A restarts its fork server by itself and runs jobs again."""
    execs = tmp_path / "executions.jsonl"
    gate = tmp_path / "gate-closed"
    monkeypatch.setenv("IMPORTGATE_CLOSED", str(gate))  # read by importgate.py at import
    handlers = {"work": {"target": "importgate:work"}}
    worker = {**LEASE, "slots": 2, "warm_children": 0}
    a = daemons.start(daemons.config(handlers, worker), tag="A")
    b = daemons.start(daemons.config(handlers, worker), tag="B")
    gate.touch()
    os.kill(forkserver_of(a), signal.SIGKILL)
    a.wait_log("fork server died")

    jobs = [db.enqueue("work", {"file": str(execs), "seconds": 0.2}) for _ in range(6)]
    for job_id in jobs:
        row = db.wait_status(job_id, "completed", "dead")
        assert row["status"] == "completed" and row["attempts"] == 1
    assert {e.tag for e in read_executions(execs)} == {"B"}
    assert "claimed" not in a.log()

    gate.unlink()
    a.wait_log(r"fork server restarted \(pid \d+\)", timeout=60)
    b.send(signal.SIGTERM)
    b.wait_exit()
    later = db.enqueue("work", {"file": str(execs), "seconds": 0.2})
    assert db.wait_status(later, "completed", "dead")["status"] == "completed"
    assert only_execution(execs, later).tag == "A"


def test_sigstop_of_the_parent_past_its_lease_child_fences_rescue_then_late_outcome_fenced(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    execs = tmp_path / "executions.jsonl"
    config = write_config(daemons)
    a = daemons.start(config, tag="A")
    job_id = db.enqueue("work", {"file": str(execs), "seconds": [60, 1]})
    wait_for(lambda: read_executions(execs, job_id), what="A to start the job")
    time.sleep(1.5)

    a.send(signal.SIGSTOP)  # a frozen host: no renewals, no kills from the parent
    try:
        first = only_execution(execs, job_id)
        wait_for(lambda: is_gone(first.pid), timeout=15, what="A's child to stop itself")
        lease_end = lease_end_of(db, job_id, a.worker_id)
        b = daemons.start(config, tag="B")
        db.wait_status(job_id, "completed", "dead")
    finally:
        a.send(signal.SIGCONT)
    assert_fenced_rescue(db, job_id, execs, a, b, lease_end)
    assert a.proc is not None and a.proc.poll() is None


def test_a_chatty_job_survives_its_parent_frozen_within_its_lease(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    """A child heartbeating many times a second fills the socket of a daemon frozen for
    15 s: its sends wait for the daemon (no timeout fails the job); after SIGCONT the job
    completes on its first attempt."""
    execs = tmp_path / "executions.jsonl"
    config = daemons.config({"chatty": {"target": "faulthandlers:chatty"}}, {"lease": "60s"})
    a = daemons.start(config, tag="A")
    job_id = db.enqueue("chatty", {"file": str(execs), "seconds": 22}, max_attempts=1)
    wait_for(lambda: read_executions(execs, job_id), what="the job to start")
    time.sleep(1)
    a.send(signal.SIGSTOP)
    try:
        time.sleep(15)
    finally:
        a.send(signal.SIGCONT)
    row = db.wait_status(job_id, "completed", "dead")
    assert (row["status"], row["attempts"]) == ("completed", 1), row["last_error"]
    assert row["result"]["beats"] > 200

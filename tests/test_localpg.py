"""LocalPostgres against real server processes (no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import LiteralString

import psycopg
import pytest

from pgworkerd.localpg import LocalPostgres, LocalPostgresError, find_server_bindir

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalPostgres]:
    # One cluster shared by this module's tests (initdb costs 1-2 s); each test leaves it
    # running.
    with LocalPostgres() as c:
        yield c


def query_one(dsn: str, query: LiteralString) -> object:
    with psycopg.connect(dsn) as c:
        row = c.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_find_server_bindir() -> None:
    bindir = find_server_bindir()
    for exe in ("postgres", "initdb", "pg_ctl"):
        assert os.access(bindir / exe, os.X_OK), bindir / exe


def test_start_connect_select_one(cluster: LocalPostgres) -> None:
    assert cluster.is_running()
    assert query_one(cluster.dsn(), "select 1") == 1
    assert query_one(cluster.tcp_dsn(), "select 1") == 1
    assert query_one(cluster.dsn(), "show fsync") == "off"


def test_restart_keeps_data(cluster: LocalPostgres) -> None:
    cluster.create_database("keep")
    dsn = cluster.dsn("keep")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("create table kept (x int); insert into kept values (42)")
    cluster.restart()
    assert cluster.is_running()
    assert query_one(dsn, "select x from kept") == 42


def test_crash_then_start_recovers(cluster: LocalPostgres) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute("create table survived (x int); insert into survived values (7)")
    cluster.crash()
    assert not cluster.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.dsn(), connect_timeout=2).close()
    cluster.start()
    assert query_one(cluster.dsn(), "select x from survived") == 7


def test_two_clusters_at_once(pg: LocalPostgres, cluster: LocalPostgres) -> None:
    assert pg.port != cluster.port
    assert pg.base_dir != cluster.base_dir
    assert query_one(pg.dsn(), "show port") == str(pg.port)
    assert query_one(cluster.dsn(), "show port") == str(cluster.port)


def test_create_database_is_idempotent(pg: LocalPostgres) -> None:
    pg.create_database("twice")
    pg.create_database("twice")
    assert query_one(pg.dsn("twice"), "select current_database()") == "twice"


def test_taken_port_raises_with_server_log(pg: LocalPostgres) -> None:
    c = LocalPostgres(port=pg.port)
    try:
        with pytest.raises(LocalPostgresError, match="could not bind"):
            c.start()
    finally:
        c.cleanup()
    assert not c.base_dir.exists()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_cluster_of_killed_process_is_reaped() -> None:
    # A process that starts a cluster and dies by SIGKILL without cleaning up.
    script = (
        "import os, signal\n"
        "from pgworkerd.localpg import LocalPostgres\n"
        "c = LocalPostgres(); c.start(); print(c.base_dir, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    base_dir = Path(proc.stdout.strip())
    postmaster_pid = int((base_dir / "data" / "postmaster.pid").read_text().split()[0])

    LocalPostgres().cleanup()  # any new default cluster reaps abandoned ones

    # Another xdist worker may be the one reaping it, so allow a moment.
    assert wait_until(lambda: not base_dir.exists())
    assert wait_until(lambda: not _alive(postmaster_pid))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a killed orphan lingers as a zombie until init collects it

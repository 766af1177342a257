"""LocalPostgres against real server processes (no mocks)."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import LiteralString

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgworkerd.devcluster.localpg import LocalPostgres, LocalPostgresError, find_server_bindir

REPO_ROOT = Path(__file__).resolve().parents[2]


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
        "from pgworkerd.devcluster.localpg import LocalPostgres\n"
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


# -- privacy: no other local user gets in (audit findings 3 and 4) ---------------------------

PSQL = find_server_bindir() / "psql"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
# What `nobody` ran in the audit: OS commands as the cluster's OS user.
COPY_FROM_PROGRAM = ("CREATE TEMP TABLE o (l text)", "COPY o FROM PROGRAM 'id'", "SELECT l FROM o")


def other_user_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "acting as another local user (nobody) needs root"
    if not os.access(RUNUSER, os.X_OK):
        return "runuser (util-linux) is not installed"
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return "this machine has no `nobody` user"
    return None


needs_other_user = pytest.mark.skipif(
    other_user_unavailable() is not None, reason=str(other_user_unavailable())
)


def as_nobody(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    # A clean environment: nothing of ours (PGPASSFILE, PGPASSWORD...) reaches the command.
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(
        [RUNUSER, "-u", "nobody", "--", *map(str, argv)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def psql_as_nobody(conninfo: str) -> subprocess.CompletedProcess[str]:
    commands = [arg for c in COPY_FROM_PROGRAM for arg in ("-c", c)]
    # -w: never prompt for a password (there is no one to type it).
    return as_nobody(PSQL, "-X", "-w", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo, *commands)


def bare(dsn: str) -> str:
    """The DSN without our passfile: what another user could guess (host, port, user)."""
    params = conninfo_to_dict(dsn)
    params.pop("passfile", None)
    return make_conninfo("", **params)


@needs_other_user
@pytest.mark.parametrize("variant", ["our DSN", "bare DSN"])
@pytest.mark.parametrize("transport", ["tcp", "unix socket"])
def test_another_local_user_cannot_connect(
    cluster: LocalPostgres, transport: str, variant: str
) -> None:
    dsn = cluster.tcp_dsn() if transport == "tcp" else cluster.dsn()
    proc = psql_as_nobody(dsn if variant == "our DSN" else bare(dsn))
    assert proc.returncode != 0, proc.stdout
    assert "uid=" not in proc.stdout  # COPY ... FROM PROGRAM never ran
    # TCP reaches the server, which asks for the password nobody cannot read; the socket's
    # directory is closed to them before the server is even asked.
    expected = "no password supplied" if transport == "tcp" else "Permission denied"
    assert expected in proc.stderr, proc.stderr


def test_cluster_files_are_private(cluster: LocalPostgres) -> None:
    me = os.geteuid()
    for d in (cluster.base_dir, cluster.socket_dir):
        st = d.stat()
        assert st.st_mode & 0o007 == 0, f"{d} is open to other users: {st.st_mode & 0o777:o}"
        assert st.st_mode & 0o020 == 0 or d == cluster.socket_dir, f"{d} group-writable"
    st = cluster.passfile.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == me and st.st_mode & 0o777 == 0o600
    hba = (cluster.data_dir / "pg_hba.conf").read_text().splitlines()
    rules = [line.split() for line in hba if line.strip() and not line.lstrip().startswith("#")]
    assert rules, hba
    assert all(rule[-1] == "scram-sha-256" for rule in rules), rules


def test_dsns_carry_a_passfile_not_a_password(pg: LocalPostgres, cluster: LocalPostgres) -> None:
    for c in (pg, cluster):  # the suite's cluster (tests/conftest.py) and a fresh one
        for dsn in (c.dsn(), c.tcp_dsn(), c.dsn("x", user="y")):
            params = conninfo_to_dict(dsn)
            assert "password" not in params
            assert params["passfile"] == str(c.passfile)
            assert c.password not in dsn
    assert pg.password != cluster.password  # random per cluster


def test_grant_login_lets_a_role_in_with_the_cluster_password(cluster: LocalPostgres) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute("DROP ROLE IF EXISTS app_role")
        c.execute("CREATE ROLE app_role")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(cluster.tcp_dsn(user="app_role"), connect_timeout=10).close()
    cluster.grant_login("app_role")
    for dsn in (cluster.dsn(user="app_role"), cluster.tcp_dsn(user="app_role")):
        assert query_one(dsn, "select current_user") == "app_role"


def test_demo_is_private_and_never_shows_its_password(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [str(Path(sys.executable).with_name("pgworkerd")), "demo", "--seconds", "6"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        assert demo.stdout is not None
        dsn = None
        for line in demo.stdout:
            output.append(line)
            found = re.search(r"--dsn '([^']*)'", line)
            if found:
                dsn = found.group(1)
                break
        assert dsn is not None, "".join(output)
        params = conninfo_to_dict(dsn)
        assert "password" not in params, dsn
        password = Path(params["passfile"]).read_text().strip().rsplit(":", 1)[1]
        assert len(password) >= 20
        # No process shows it in its command line while the demo runs.
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                assert password.encode() not in cmdline.read_bytes(), cmdline
        if other_user_unavailable() is None:
            tcp = make_conninfo(bare(dsn), host="127.0.0.1")
            proc = psql_as_nobody(tcp)
            assert proc.returncode != 0 and "uid=" not in proc.stdout, proc.stdout
            assert "no password supplied" in proc.stderr, proc.stderr
        output.append(demo.stdout.read())
        assert demo.wait(60) == 0, "".join(output)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert password not in "".join(output)


def test_the_demos_hints_run_as_printed_from_a_shell_without_the_venv_on_path(
    tmp_path: Path,
) -> None:
    """The demo prints commands to try (jobs, explain, logs, web): pasted into a shell
    whose PATH lacks the venv (a fresh terminal after deploy/demo), in another directory,
    each runs. A bare `pgworkerd` there was "command not found"."""
    demo = subprocess.Popen(
        [str(Path(sys.executable).with_name("pgworkerd")), "demo", "--seconds", "60"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output: list[str] = []
    hints: dict[str, str] = {}
    shell_env = {**os.environ, "PATH": "/usr/bin:/bin"}
    assert shutil.which("pgworkerd", path=shell_env["PATH"]) is None
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            output.append(line)
            found = re.search(
                r"demo: (watch them with|why a job is where it is|"
                r"what a job printed|the dashboard): (.*)$",
                line,
            )
            if found:
                hints[found[1]] = found[2]
            if len(hints) == 4:
                break
        assert len(hints) == 4, "".join(output)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()

        def run(command: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["bash", "-c", command],
                cwd=elsewhere,
                env=shell_env,
                capture_output=True,
                text=True,
                timeout=60,
            )

        jobs = run(hints["watch them with"])
        assert jobs.returncode == 0 and "flaky" in jobs.stdout, jobs
        explained = run(hints["why a job is where it is"])
        assert explained.returncode == 0 and "flaky" in explained.stdout, explained
        # the flaky job prints a line per attempt; once an attempt ended it is stored
        logs = wait_for_output(lambda: run(hints["what a job printed"]), "flaky: attempt ")
        assert logs.returncode == 0, logs

        command, _, note = hints["the dashboard"].partition("#")
        assert command.rstrip().endswith(" web --no-login") and "8470" in note
        web = subprocess.Popen(
            ["bash", "-c", f"exec {command.strip()} --port 0"],
            cwd=elsewhere,
            env=shell_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert web.stderr is not None
            served = web.stderr.readline() + web.stderr.readline()  # after the no-login warning
            assert re.search(r"serving http://127\.0\.0\.1:\d+/", served), served
            web.send_signal(signal.SIGINT)
            assert web.wait(timeout=60) == 0
        finally:
            if web.poll() is None:
                web.kill()
                web.wait()
        os.killpg(demo.pid, signal.SIGTERM)
        output.append(demo.stdout.read())
        assert demo.wait(60) == 0, "".join(output)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def wait_for_output(
    attempt: Callable[[], subprocess.CompletedProcess[str]], text: str
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 60
    while True:
        done = attempt()
        if text in done.stdout or time.monotonic() > deadline:
            assert text in done.stdout, done
            return done
        time.sleep(0.5)


# Reaper: only our own directories, never through a symlink (audit finding 4).


@pytest.fixture
def victim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """A running cluster that is NOT a default throwaway one: no reaper may touch it."""
    base = Path(tempfile.mkdtemp(prefix="pgworkerd-victim-", dir="/tmp"))
    c = LocalPostgres(base)
    try:
        c.start()
        yield c
    finally:
        c.cleanup()


def plant(owner: str, target: Path) -> Path:
    """A directory that looks abandoned to the reaper (free owner.lock), with `data` a
    symlink to someone else's cluster."""
    planted = Path(f"/tmp/pgworkerd-pg-planted-{uuid.uuid4().hex[:8]}")
    script = " && ".join(
        [f"mkdir -m 755 {planted}", f"touch {planted}/owner.lock", f"ln -s {target} {planted}/data"]
    )
    if owner == "nobody":
        proc = as_nobody("sh", "-c", script)
    else:
        proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return planted


@pytest.mark.parametrize(
    "owner",
    [pytest.param("nobody", marks=needs_other_user), "ourselves"],
)
def test_reaper_never_follows_a_planted_data_symlink(
    victim: LocalPostgres, owner: str, caplog: pytest.LogCaptureFixture
) -> None:
    planted = plant(owner, victim.data_dir)
    try:
        caplog.set_level(logging.DEBUG, logger="pgworkerd.devcluster.localpg")
        LocalPostgres().cleanup()  # a new default cluster reaps abandoned ones first
        assert victim.is_running()
        assert query_one(victim.dsn(), "select 1") == 1
        assert (planted / "data").is_symlink()  # not even deleted
        assert str(planted) in caplog.text  # left alone, and said so
    finally:
        shutil.rmtree(planted, ignore_errors=True)

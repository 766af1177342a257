"""A rolling upgrade across expand migrations (README "Upgrading"): the previous release,
installed from its sdist in a virtualenv of its own, keeps running jobs against the schema
the new `pgworkerd migrate` leaves, beside a daemon of the new code, and every job
enqueued during the whole window completes exactly once.

The previous release is tests/acceptance/releases/PREVIOUS_RELEASE (how it was made and
how to refresh it: the README there). Its dependencies (psycopg & co.) come from this
virtualenv's site-packages through a .pth file, so that nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import daemon_harness
import psycopg
import pytest
from daemon_harness import PGWORKERD, DaemonProcess, Daemons, Db, wait_for
from psycopg import sql

from pgworkerd.queue.migrate import latest_version, migrations
from pgworkerd.queue.queries import finished_channel

PREVIOUS_RELEASE = "pgworkerd-0.2.0.tar.gz"
PREVIOUS_VERSION = "0.2.0"
PREVIOUS_SCHEMA = 5  # the latest migration the previous release ships
RELEASES = Path(__file__).resolve().parent / "releases"
HANDLERS = {"work": {"target": "jobhandlers:work"}}
INSTALL_TIMEOUT = 300  # an isolated build environment on a loaded 2-core machine


@pytest.fixture(scope="module")
def previous_pgworkerd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's `pgworkerd` command, in a virtualenv of its own."""
    venv = tmp_path_factory.mktemp("previous") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"),
            *("--no-deps", "--disable-pip-version-check", str(RELEASES / PREVIOUS_RELEASE)),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path line: the .pth files there (this checkout's editable install) are not
    # read, so `import pgworkerd` finds the release, and psycopg comes from here.
    (Path(site) / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    found = subprocess.run(
        [str(python), "-c", "import pgworkerd, psycopg; print(pgworkerd.__version__)"],
        capture_output=True,
        text=True,
        check=False,
        cwd=venv,  # not this checkout, which `-c` would put first on sys.path
    )
    assert found.stdout.strip() == PREVIOUS_VERSION, found.stderr
    return venv / "bin" / "pgworkerd"


@pytest.fixture
def fresh_schema(test_db_dsn: str) -> Iterator[str]:
    """A schema name nobody migrated yet (the previous release migrates it), dropped after."""
    name = f"up_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def migrate_with(program: Path, dsn: str, schema: str) -> str:
    proc = subprocess.run(
        [str(program), "--dsn", dsn, "--schema", schema, "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def start_previous(
    daemons: Daemons, program: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> DaemonProcess:
    with monkeypatch.context() as patch:
        patch.setattr(daemon_harness, "PGWORKERD", program)
        # (an empty [logging]: the previous release knows no job_events, which the
        # harness sets for the tests that read the lines of jobs that go well)
        return daemons.start(HANDLERS, tag=tag, tables={"logging": {}})


def test_previous_release_runs_jobs_beside_new_daemons_across_the_expand_migrations(
    previous_pgworkerd: Path,
    test_db_dsn: str,
    conn: psycopg.Connection,
    fresh_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = fresh_schema
    new_versions = [m.version for m in migrations() if m.version > PREVIOUS_SCHEMA]
    assert new_versions, "no migration after the previous release's: nothing to test"
    assert all(m.compatible_with <= PREVIOUS_SCHEMA for m in migrations()), (
        "a migration is not compatible with the previous release: it is a contract migration"
    )

    # The schema as the previous release left it, and its daemon running jobs.
    assert migrate_with(previous_pgworkerd, test_db_dsn, schema) == (
        f"schema {schema}: applied migrations 1, 2, 3, 4, 5"
    )
    db = Db.prepare(conn, schema)
    daemons = Daemons(tmp_path, test_db_dsn, schema)
    enqueued: list[int] = []

    def enqueue(n: int, seconds: float) -> list[int]:
        ids = [db.enqueue("work", {"seconds": seconds}) for _ in range(n)]
        enqueued.extend(ids)
        return ids

    def tags(ids: list[int]) -> set[str]:
        return {e["tag"] for e in db.executions() if e["job_id"] in ids}

    listener = psycopg.connect(test_db_dsn, autocommit=True)
    try:
        old = start_previous(daemons, previous_pgworkerd, "old", monkeypatch)
        before = enqueue(4, 0.2)

        # The new release's expand migrations, under the running old daemon.
        applied = ", ".join(map(str, new_versions))
        assert migrate_with(PGWORKERD, test_db_dsn, schema) == (
            f"schema {schema}: applied migrations {applied}"
        )
        # The old daemon's finishes fire the new schema's finished notification too.
        listener.execute(f'LISTEN "{finished_channel(schema)}"')
        during = enqueue(4, 0.2)
        wait_for(lambda: tags(during) == {"old"}, what="the old daemon to run jobs after it")
        for job_id in during:
            db.wait_status(job_id, "completed")
        notified = {n.payload for n in listener.notifies(timeout=1.0)}
        assert {str(job_id) for job_id in during} <= notified
        # ...and are recorded in the attempt history (0012), without resource figures.
        history = db.rows(
            "SELECT job_id, outcome, peak_memory FROM {schema}.attempts"
            " WHERE job_id = ANY(%s) ORDER BY job_id",
            (during,),
        )
        assert [(h["job_id"], h["outcome"], h["peak_memory"]) for h in history] == [
            (job_id, "completed", None) for job_id in sorted(during)
        ]

        # An old daemon that starts now (a restart, or a host not upgraded yet) meets the
        # newer schema, says so, and runs.
        restarted = start_previous(daemons, previous_pgworkerd, "old-restarted", monkeypatch)
        restarted.wait_log(
            f"schema '{schema}' is at version {latest_version()}, newer than this pgworkerd "
            f"knows \\({PREVIOUS_SCHEMA}\\) but compatible with it"
        )
        new = daemons.start(HANDLERS, tag="new")

        # Jobs long enough that every daemon gets some: keep enqueueing until each of the
        # three has run one of the jobs enqueued after the new daemon started.
        beside: list[int] = []
        deadline = time.monotonic() + 40
        while tags(beside) != {"old", "old-restarted", "new"}:
            assert time.monotonic() < deadline, f"only {sorted(tags(beside))} ran jobs"
            beside += enqueue(6, 0.5)
            time.sleep(0.5)

        for job_id in enqueued:
            assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
        for daemon in (old, restarted, new):
            assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log()
    finally:
        listener.close()
        daemons.stop_all()

    # Exactly once: one attempt, one execution that ended, for every job of the window.
    rows = db.rows(
        "SELECT j.id, j.attempts, count(e.id) AS runs, count(e.ended_at) AS ended"
        " FROM {schema}.jobs j LEFT JOIN {schema}.executions e ON e.job_id = j.id"
        " GROUP BY j.id ORDER BY j.id"
    )
    assert [r["id"] for r in rows] == sorted(enqueued)
    assert [r for r in rows if (r["attempts"], r["runs"], r["ended"]) != (1, 1, 1)] == []
    assert before and tags(before) == {"old"}

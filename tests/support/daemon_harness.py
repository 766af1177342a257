"""Helpers for the acceptance tests: the real `pgworkerd run` as a subprocess, its config,
and the job and execution rows it leaves behind.

Everything waits on conditions (rows, log lines, processes) with generous deadlines;
nothing sleeps a fixed time and hopes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import psycopg
import pytest

# The process helpers live in proctree (the benchmarks use them too); re-exported here
# for the tests that import them with the rest of the harness.
from proctree import children_of as children_of
from proctree import is_gone as is_gone
from proctree import process_state as process_state
from proctree import process_title as process_title
from psycopg import sql
from psycopg.rows import dict_row

from pgworkerd import client
from pgworkerd.queue import admin

T = TypeVar("T")

PGWORKERD = Path(sys.executable).with_name("pgworkerd")
TESTS_DIR = Path(__file__).resolve().parent
# Long enough for a loaded 2-core machine; conditions normally hold within a second.
DEADLINE = 30.0

EXECUTIONS_DDL = """
CREATE TABLE {table} (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    attempt    integer NOT NULL,
    pid        integer NOT NULL,
    tag        text NOT NULL,
    started_at timestamptz NOT NULL,
    alive_at   timestamptz NOT NULL,
    ended_at   timestamptz
)
"""

# Short leases so lost daemons are noticed within seconds; renewals 1 s apart leave a
# loaded machine several seconds of slack before a child fences itself.
DEFAULT_WORKER: dict[str, Any] = {
    "slots": 2,
    "lease": "6s",
    "renew_interval": "1s",
    "poll_interval": "1s",
    "drain_timeout": "5s",
    "kill_grace": "2s",
    "warm_children": 1,
    "backoff": "0s",
}


def wait_for(
    condition: Callable[[], T | Literal[False] | None],
    *,
    timeout: float = DEADLINE,
    what: str = "condition",
) -> T:
    """Poll until `condition()` is truthy and return its value; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# -- config ---------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_config(
    path: Path,
    handlers: dict[str, dict[str, Any]],
    worker: dict[str, Any] | None = None,
    *,
    name: str = "test",
    tables: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Write a daemon config: DEFAULT_WORKER overridden by `worker`, `handlers` as
    {name: {"target": ..., other keys}} and other `tables` ({"logs": {...}}); the DSN
    and schema come from the command line."""
    lines = ["[worker]", f"name = {_toml_value(name)}"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in {**DEFAULT_WORKER, **(worker or {})}.items()]
    # the tests read the lines of jobs that go well ([logging] job_events: "problems" by
    # default), unless a test says otherwise
    tables = {"logging": {"job_events": "all"}} | (tables or {})
    for table, keys in tables.items():
        lines += ["", f"[{table}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    for handler, keys in handlers.items():
        lines += ["", f"[handlers.{handler}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class DaemonProcess:
    """One `pgworkerd run` subprocess; its stderr goes to a log file in tmp_path."""

    dsn: str
    schema: str
    config: Path
    log_path: Path
    tag: str
    proc: subprocess.Popen[bytes] | None = None
    worker_id: str = ""
    # a cgroup v2 directory the daemon starts in (tests of [worker] job_cgroups)
    cgroup: str | None = None
    # a command the daemon runs under (e.g. setpriv with a smaller bounding set)
    wrapper: tuple[str, ...] = ()
    _log_file: Any = field(default=None, repr=False)

    def start(self, *, wait_ready: bool = True) -> DaemonProcess:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
            ),
            "JOBHANDLERS_DSN": self.dsn,
            "JOBHANDLERS_SCHEMA": self.schema,
            "JOBHANDLERS_TAG": self.tag,
        }
        env.pop("NOTIFY_SOCKET", None)
        self._log_file = self.log_path.open("ab")
        cmd = [
            str(PGWORKERD),
            "--dsn",
            self.dsn,
            "--schema",
            self.schema,
            "--config",
            str(self.config),
            "run",
        ]
        cmd = [*self.wrapper, *cmd]
        if self.cgroup is not None:  # (the shell moves itself, then becomes the daemon)
            cmd = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.cgroup, *cmd]
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=self.log_path.parent,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's signals reach only what the test sends
        )
        if wait_ready:
            ready = re.compile(r"running as (\S+):")
            found = ready.search(self.wait_log(ready.pattern))
            assert found is not None  # wait_log returned the log that matches it
            self.worker_id = found[1]
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, *, timeout: float = DEADLINE) -> str:
        """Wait for a log line matching the regex `pattern`; returns the line."""

        def found() -> str | None:
            for line in self.log().splitlines():
                if re.search(pattern, line):
                    return line
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(
                    f"daemon {self.tag} exited with {self.proc.returncode} before logging "
                    f"{pattern!r}:\n{self.log()}"
                )
            return None

        return wait_for(found, timeout=timeout, what=f"daemon {self.tag} to log {pattern!r}")

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = DEADLINE) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"daemon {self.tag} still running after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        """Teardown: SIGKILL if still running (its children die with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


# -- rows -----------------------------------------------------------------------------------


@dataclass
class Db:
    """The test schema's jobs and executions, over one autocommit connection."""

    conn: psycopg.Connection
    schema: str

    @classmethod
    def prepare(cls, conn: psycopg.Connection, schema: str) -> Db:
        conn.execute(sql.SQL(EXECUTIONS_DDL).format(table=sql.Identifier(schema, "executions")))
        return cls(conn, schema)

    def enqueue(self, handler: str, payload: dict[str, Any] | None = None, **kw: Any) -> int:
        return client.enqueue(self.conn, handler, payload, schema=self.schema, **kw)

    def job(self, job_id: int) -> dict[str, Any]:
        row = admin.get(self.conn, job_id, schema=self.schema)
        assert row is not None, f"job {job_id} not found"
        return row

    def executions(self, job_id: int | None = None) -> list[dict[str, Any]]:
        query = sql.SQL(
            "SELECT * FROM {} WHERE %(job)s::bigint IS NULL OR job_id = %(job)s ORDER BY id"
        )
        with self.conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                query.format(sql.Identifier(self.schema, "executions")), {"job": job_id}
            ).fetchall()

    def rows(self, text: str, params: Any = None) -> list[dict[str, Any]]:
        """Run SQL with {schema} formatted as the quoted schema name."""
        query = sql.SQL(text).format(schema=sql.Identifier(self.schema))
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    def now(self) -> Any:
        [(now,)] = self.conn.execute("SELECT clock_timestamp()").fetchall()
        return now

    def wait_status(self, job_id: int, *statuses: str, timeout: float = DEADLINE) -> dict[str, Any]:
        return wait_for(
            lambda: (row := self.job(job_id))["status"] in statuses and row,
            timeout=timeout,
            what=f"job {job_id} to become {' or '.join(statuses)}",
        )

    def wait_started(
        self, job_id: int, count: int = 1, *, timeout: float = DEADLINE
    ) -> dict[str, Any]:
        """Wait until the job's `count`th execution has started; returns that execution."""
        rows = wait_for(
            lambda: len(found := self.executions(job_id)) >= count and found,
            timeout=timeout,
            what=f"execution {count} of job {job_id} to start",
        )
        return rows[count - 1]


class Daemons:
    """Starts daemons against one database schema and kills whatever is left at the end."""

    def __init__(self, tmp_path: Path, dsn: str, schema: str) -> None:
        self.tmp_path, self.dsn, self.schema = tmp_path, dsn, schema
        self.started: list[DaemonProcess] = []

    def config(
        self,
        handlers: dict[str, dict[str, Any]],
        worker: dict[str, Any] | None = None,
        *,
        path: Path | None = None,
        tables: dict[str, dict[str, Any]] | None = None,
    ) -> Path:
        if path is None:
            path = self.tmp_path / f"pgworkerd-{len(list(self.tmp_path.glob('*.toml')))}.toml"
        return write_config(path, handlers, worker, tables=tables)

    def start(
        self,
        handlers_or_config: dict[str, dict[str, Any]] | Path,
        worker: dict[str, Any] | None = None,
        *,
        tag: str = "A",
        tables: dict[str, dict[str, Any]] | None = None,
        cgroup: str | None = None,
        wrapper: tuple[str, ...] = (),
    ) -> DaemonProcess:
        """Start a daemon (from a config path, or handlers, worker settings and other
        tables) and wait until it logs that it is running."""
        config = (
            handlers_or_config
            if isinstance(handlers_or_config, Path)
            else self.config(handlers_or_config, worker, tables=tables)
        )
        daemon = DaemonProcess(
            self.dsn,
            self.schema,
            config,
            self.tmp_path / f"daemon-{tag}.log",
            tag,
            cgroup=cgroup,
            wrapper=wrapper,
        )
        self.started.append(daemon)
        return daemon.start()

    def stop_all(self) -> None:
        """Kill what is still running and print every log (pytest shows it on failure)."""
        for daemon in self.started:
            daemon.stop()
        for daemon in self.started:
            print(f"--- daemon {daemon.tag} log ---\n{daemon.log()}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a pgworkerd command against this database and schema, in the test's own
        process (tests/support/clirun.py says what that keeps of a subprocess, and what
        must stay one: `cli_process`)."""
        import clirun  # imports the click commands: only the tests that run them pay

        return clirun.invoke("--dsn", self.dsn, "--schema", self.schema, *args, clean=False)

    def cli_process(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`cli` as a real `pgworkerd` subprocess."""
        return subprocess.run(
            [str(PGWORKERD), "--dsn", self.dsn, "--schema", self.schema, *args],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=False,
        )

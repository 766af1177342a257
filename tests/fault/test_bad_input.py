"""Bad input, one wrong thing at a time: the real `pgworkerd` command as a subprocess (or
the SQL enqueue functions) fed a broken config, an unimportable handler, an unreachable or
refusing database, a missing or mismatched schema, an unknown option...

Every case checks, where it applies, that
1. the message names the problem (for a config: the file, the key and the line),
2. the exit code is the documented one (docs/reference/exit-codes.md, pgworkerd.exitcodes.ExitCode),
3. a user error prints no Python traceback (and never the password),
4. nothing was written: no job row, no registry row, the schema unchanged.

Complements tests/unit/test_config.py (parse_config errors in-process) and
tests/integration/test_cli_queue.py (enqueue options, migrate/enqueue/jobs against a closed port).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from daemon_harness import wait_for
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgworkerd import client, model
from pgworkerd.config import ConfigError, load_config
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import admin
from pgworkerd.queue.migrate import latest_version, migrate
from pgworkerd.queue.queries import render

T = TypeVar("T")

PGWORKERD = Path(sys.executable).with_name("pgworkerd")
# Planted in DSNs and configs; must never be printed.
PASSWORD = "Bad1nput-pw-never-shown"
DEADLINE = 30.0


# -- helpers --------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the caller's PGWORKERD_*, libpq PG* and NOTIFY_SOCKET."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGWORKERD_", "PG")) and k != "NOTIFY_SOCKET"
    }
    env.update(extra)
    return env


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PGWORKERD), *args],
        capture_output=True,
        text=True,
        env=clean_env() if env is None else env,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


def assert_refused(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """The documented exit code, every needle in stderr, no traceback, no password."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code!r}:\n{output}"
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in stderr:\n{proc.stderr}"
    assert "Traceback" not in output, output
    assert PASSWORD not in output, output


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def snapshot(conn: psycopg.Connection, schema: str) -> dict[str, Any]:
    """What a refused command must leave as it was: the schema's existence, its
    version rows, and how many jobs and registry rows it holds."""

    def count(table: str) -> int | None:
        exists = conn.execute("SELECT to_regclass(%s)", [f'"{schema}".{table}']).fetchone()
        if not exists or exists[0] is None:
            return None
        found = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
        ).fetchone()
        return int(found[0]) if found else None

    versions = None
    if count("schema_version") is not None:
        versions = conn.execute(
            sql.SQL("SELECT version, name FROM {} ORDER BY version").format(
                sql.Identifier(schema, "schema_version")
            )
        ).fetchall()
    exists = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %s)", [schema]
    ).fetchone()
    return {
        "schema exists": bool(exists and exists[0]),
        "versions": versions,
        "jobs": count("jobs"),
        "workers": count("workers"),
    }


def drop_schema(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


# -- configuration files: check-config and run ----------------------------------------------

# (file content, fragments of the message; {path} is the config file). One of each kind
# through both commands as subprocesses...
CLI_CONFIG_CASES = [
    pytest.param(
        "[worker]\nslots = 4\nlease = \n",
        ["{path}: invalid TOML", "at line 3"],
        id="syntax-missing-value",
    ),
    pytest.param(
        "[worker]\n# caf\xe9 in latin-1\n".encode("latin-1"),
        ["{path}:2: not UTF-8 text"],
        id="not-utf8",
    ),
    pytest.param(
        '[handlers.h]\ntarget = "pgworkerd.examples:echo"\nmax_attempts = "3"\n',
        ["{path}:3: handlers.h.max_attempts:", "expected an integer, got str '3'"],
        id="type-handler-max-attempts",
    ),
    pytest.param(
        '[handlers.h]\ntarget = "pgworkerd.examples:echo"\ntimout = "1m"\n',
        ["{path}:3: handlers.h.timout: unknown key", "timeout"],
        id="unknown-key-typo",
    ),
    pytest.param(
        '[worker]\ndrain_timeout = "5 minutes"\n',
        ["{path}:2: worker.drain_timeout:", "is not a duration", '"30s"'],
        id="duration-words",
    ),
    pytest.param(
        "[workers]\nslots = 2\n",
        [
            "{path}:1: [workers]: unknown table",
            "known: database, worker, logging, metrics, handlers",
        ],
        id="unknown-table",
    ),
    pytest.param(None, ["{path}: cannot read config: No such file or directory"], id="missing"),
]
# ... and more of each kind read in-process (the same load_config the commands call).
MORE_CONFIG_CASES = [
    pytest.param(
        f'[database]\ndsn = "postgresql://app:{PASSWORD}@db/app\n',
        ["{path}: invalid TOML", "at line 2"],
        id="syntax-unterminated-dsn-with-password",
    ),
    pytest.param(
        '[worker]\nqueues = "mail"\n',
        ["{path}:2: worker.queues:", "expected a list of non-empty strings"],
        id="type-string-for-list",
    ),
    pytest.param(
        "slots = 4\nworker = 5\n",
        ["{path}:1: slots: unknown top-level key"],
        id="type-top-level-key",
    ),
    pytest.param(
        "worker = 5\n",
        ["{path}:1: [worker]: must be a table"],
        id="type-not-a-table",
    ),
    pytest.param(
        "[worker]\nlease = nan\n",
        ["{path}:2: worker.lease:", "out of range"],
        id="duration-nan",
    ),
    pytest.param(
        '[handlers.h]\ntarget = "pgworkerd.examples:echo"\nlease = "100000000000d"\n',
        ["{path}:3: handlers.h.lease:", "out of range"],
        id="duration-beyond-timestamps",
    ),
    pytest.param(
        '[database]\nstatement_timeout = "30d"\n',
        ["{path}:2: database.statement_timeout:", "out of range"],
        id="duration-beyond-int-milliseconds",
    ),
    pytest.param(
        '[worker]\nmemory_limit = "2XB"\n',
        ["{path}:2: worker.memory_limit:", "is not a size"],
        id="size-unknown-unit",
    ),
    pytest.param(
        '[handlers.h]\ntarget = "pgworkerd.examples:echo"\nmemory_limit = "-2GiB"\n',
        ["{path}:3: handlers.h.memory_limit:", "is negative"],
        id="size-negative",
    ),
    pytest.param(
        "[worker]\nmax_child_memory = 99999999999999999999\n",
        ["{path}:2: worker.max_child_memory:", "out of range"],
        id="size-absurd",
    ),
    # [logs]: a cap that would keep nothing useful or make every write heavy, a rate no
    # log should take, and what TOML lets through besides
    pytest.param(
        '[logs]\nmax_bytes_per_attempt = "10"\n',
        ["{path}:2: logs.max_bytes_per_attempt:", "too small (at least 4 KiB)"],
        id="log-cap-tiny",
    ),
    pytest.param(
        '[logs]\nmax_bytes_per_attempt = "1TiB"\n',
        ["{path}:2: logs.max_bytes_per_attempt:", "out of range (at most 64 MiB)"],
        id="log-cap-huge",
    ),
    pytest.param(
        '[logs]\nmax_bytes_per_attempt = "-1MiB"\n',
        ["{path}:2: logs.max_bytes_per_attempt:", "is negative"],
        id="log-cap-negative",
    ),
    pytest.param(
        "[logs]\nmax_bytes_per_attempt = 1e400\n",
        ["{path}:2: logs.max_bytes_per_attempt:", 'expected a size like "1MiB", got float inf'],
        id="log-cap-infinite",
    ),
    pytest.param(
        '[logs]\ncapture = "yes"\n',
        ["{path}:2: logs.capture:", "expected true or false"],
        id="log-capture-string",
    ),
    pytest.param(
        "[logs]\nforward_lines_per_second = -5\n",
        ["{path}:2: logs.forward_lines_per_second:", "expected an integer >= 0"],
        id="log-forward-negative",
    ),
    pytest.param(
        "[logs]\nforward_lines_per_second = 99999999999999999999999\n",
        ["{path}:2: logs.forward_lines_per_second:", "must be at most 100000"],
        id="log-forward-huge",
    ),
    pytest.param(
        '[logs]\ncapture = true\npath = "/etc/passwd"\n',
        ["{path}:3: logs.path: unknown key"],
        id="log-unknown-key",
    ),
    pytest.param(
        '\n[handler.h]\ntarget = "pgworkerd.examples:echo"\n',
        ["{path}:2: [handler]: unknown table"],
        id="unknown-table-dotted",
    ),
    # handler and queue names within the bounds enqueue applies (pgworkerd.bounds)
    pytest.param(
        '[handlers."echo\\u001b[2J"]\ntarget = "pgworkerd.examples:echo"\n',
        [
            "{path}",
            "[handlers.'echo\\x1b[2J']",
            "must not contain control characters (found U+001B)",
        ],
        id="handler-name-escape-sequence",
    ),
    pytest.param(
        '[handlers.h]\ntarget = "pgworkerd.examples:echo"\nqueue = " "\n',
        ["{path}:3: handlers.h.queue: queue must not be blank"],
        id="handler-queue-blank",
    ),
    pytest.param(
        '[worker]\nqueues = ["mail", "x\\u202ey"]\n',
        ["{path}:2: worker.queues: queue must not contain control characters (found U+202E)"],
        id="worker-queue-bidi-control",
    ),
]


def write_config(path: Path, content: str | bytes | None) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)


@pytest.mark.parametrize("command", ["check-config", "run"])
@pytest.mark.parametrize(("content", "expected"), CLI_CONFIG_CASES)
def test_bad_config_is_refused_naming_file_key_and_line(
    tmp_path: Path,
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection,
    command: str,
    content: str | bytes | None,
    expected: list[str],
) -> None:
    path = tmp_path / "pgworkerd.toml"
    write_config(path, content)
    before = snapshot(conn, schema)
    # A real database and schema: `run` must refuse before it registers anywhere.
    proc = cli("--dsn", test_db_dsn, "--schema", schema, "--config", str(path), command)
    assert_refused(proc, ExitCode.CONFIG, *(e.format(path=path) for e in expected))
    assert proc.stdout == ""
    assert snapshot(conn, schema) == before


@pytest.mark.parametrize(("content", "expected"), MORE_CONFIG_CASES)
def test_more_bad_configs_name_file_key_and_line(
    tmp_path: Path, content: str, expected: list[str]
) -> None:
    path = tmp_path / "pgworkerd.toml"
    write_config(path, content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    for needle in expected:
        assert needle.format(path=path) in message
    assert PASSWORD not in message


# -- handlers that do not import --------------------------------------------------------------

HANDLER_MODULES = {
    "bi_raises_at_import": "raise RuntimeError('boom while importing')\n",
    "bi_syntax_error": "def run(job:\n    return 1\n",
}


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param(
            "bi_no_such_module:run",
            ["handler 'h': cannot import 'bi_no_such_module'", "ModuleNotFoundError"],
            id="missing-module",
        ),
        pytest.param(
            "bi_raises_at_import:run",
            ["cannot import 'bi_raises_at_import'", "RuntimeError: boom while importing"],
            id="raises-at-import",
        ),
        pytest.param(
            "bi_syntax_error:run",
            ["cannot import 'bi_syntax_error'", "SyntaxError"],
            id="syntax-error",
        ),
        pytest.param(
            "pgworkerd.examples:no_such_function",
            ["handler 'h': 'pgworkerd.examples' has no function 'no_such_function'"],
            id="missing-function",
        ),
    ],
)
def test_run_refuses_a_handler_that_does_not_import_and_never_registers(
    tmp_path: Path,
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection,
    target: str,
    expected: list[str],
) -> None:
    for module, source in HANDLER_MODULES.items():
        (tmp_path / f"{module}.py").write_text(source)
    config = tmp_path / "pgworkerd.toml"
    config.write_text(f'[handlers.h]\ntarget = "{target}"\n')
    before = snapshot(conn, schema)
    proc = cli(
        *("--dsn", test_db_dsn, "--schema", schema, "--config", str(config), "run"),
        env=clean_env(PYTHONPATH=str(tmp_path)),
    )
    assert_refused(proc, ExitCode.HANDLER, *expected)
    assert snapshot(conn, schema) == before  # no registry row


def test_run_checks_handlers_before_touching_the_database(tmp_path: Path) -> None:
    """Against a closed port: exit 6 at once, no connection attempt, no retrying."""
    config = tmp_path / "pgworkerd.toml"
    config.write_text('[handlers.h]\ntarget = "bi_no_such_module:run"\n')
    dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{closed_port()}/app"
    proc = cli("--dsn", dsn, "--config", str(config), "run", timeout=DEADLINE)
    assert_refused(proc, ExitCode.HANDLER, "cannot import 'bi_no_such_module'")
    assert "database" not in proc.stderr


# -- a handler that returns something the job row cannot hold ---------------------------------

# handler name: (its body, what last_error must say about it)
UNSTORABLE = {
    "returns_set": ("return {1, 2}", "Object of type set is not JSON serializable"),
    "returns_object": ("return object()", "Object of type object is not JSON serializable"),
    "returns_bytes": ("return {'data': b'raw'}", "Object of type bytes is not JSON serializable"),
    "returns_nan": (
        "return {'ratio': float('nan')}",
        "Out of range float values are not JSON compliant",
    ),
    "returns_nul": ("return {'text': 'a\\x00b'}", "NUL"),
}


@dataclass
class DaemonRun:
    rows: dict[str, dict[str, Any]]  # by handler
    exit_code: int
    log: str


@pytest.fixture(scope="module")
def unstorable_run(
    test_db_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonRun]:
    """One daemon runs one job per UNSTORABLE handler (max_attempts 1) and an echo job,
    then is stopped with SIGTERM."""
    workdir = tmp_path_factory.mktemp("unstorable")
    source = ["from pgworkerd.worker import JobContext", ""]
    for name, (body, _) in UNSTORABLE.items():
        source += ["", f"def {name}(job: JobContext) -> object:", f"    {body}", ""]
    (workdir / "bi_unstorable.py").write_text("\n".join(source))
    config = workdir / "pgworkerd.toml"
    lines = [
        "[worker]",
        "slots = 4",
        'lease = "6s"',
        'renew_interval = "1s"',
        'poll_interval = "1s"',
        'drain_timeout = "5s"',
        'kill_grace = "2s"',
        "warm_children = 1",
    ]
    for name in UNSTORABLE:
        lines += [f"[handlers.{name}]", f'target = "bi_unstorable:{name}"']
    lines += ["[handlers.echo]", 'target = "pgworkerd.examples:echo"']
    config.write_text("\n".join(lines) + "\n")

    schema = f"t_{uuid.uuid4().hex[:8]}"
    migrate(test_db_dsn, schema=schema)
    log_path = workdir / "daemon.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        with psycopg.connect(test_db_dsn, autocommit=True) as conn:
            ids = {
                name: client.enqueue(conn, name, {"n": 1}, max_attempts=1, schema=schema)
                for name in [*UNSTORABLE, "echo"]
            }
            with log_path.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        str(PGWORKERD),
                        *("--dsn", test_db_dsn, "--schema", schema, "--config", str(config)),
                        "run",
                    ],
                    env=clean_env(PYTHONPATH=str(workdir)),
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

            def all_final() -> dict[str, dict[str, Any]] | None:
                assert proc is not None
                if proc.poll() is not None:
                    pytest.fail(f"daemon exited with {proc.returncode}:\n{log_path.read_text()}")
                rows = {name: admin.get(conn, i, schema=schema) for name, i in ids.items()}
                done = all(r and r["status"] in model.FINAL_STATUSES for r in rows.values())
                return rows if done else None

            rows = wait_for(all_final, timeout=60, what="every job to finish")
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(DEADLINE)
        yield DaemonRun(rows, exit_code, log_path.read_text(errors="replace"))
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        drop_schema(test_db_dsn, schema)


@pytest.mark.parametrize("handler", list(UNSTORABLE))
def test_unstorable_return_value_is_a_failed_attempt_saying_so(
    unstorable_run: DaemonRun, handler: str
) -> None:
    row = unstorable_run.rows[handler]
    detail = UNSTORABLE[handler][1]
    assert (row["status"], row["attempts"], row["result"]) == ("dead", 1, None), row
    assert "handler returned a value" in row["last_error"], row["last_error"]
    assert "JSON" in row["last_error"], row["last_error"]
    assert detail in row["last_error"], row["last_error"]


def test_daemon_keeps_working_after_unstorable_results(unstorable_run: DaemonRun) -> None:
    row = unstorable_run.rows["echo"]
    assert (row["status"], row["result"]) == ("completed", {"n": 1}), row
    assert unstorable_run.exit_code == ExitCode.OK, unstorable_run.log
    assert "Traceback" not in unstorable_run.log
    assert "crashed" not in unstorable_run.log


# -- payloads that are not JSON objects, through the SQL functions ----------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(
            "@schema@.enqueue('h', '[1]')",
            "payload must be a JSON object, not array",
            id="enqueue-array",
        ),
        pytest.param(
            "@schema@.enqueue('h', '\"text\"')",
            "payload must be a JSON object, not string",
            id="enqueue-string",
        ),
        pytest.param(
            "@schema@.enqueue('h', 'null')",
            "payload must be a JSON object, not null",
            id="enqueue-json-null",
        ),
        pytest.param(
            "@schema@.enqueue_many('[1]')",
            "job 1 of 1: is not a JSON object",
            id="enqueue_many-element-not-object",
        ),
        pytest.param(
            '@schema@.enqueue_many(\'[{"handler": "h", "payload": [1]}]\')',
            "job 1 of 1: payload must be a JSON object, not array",
            id="enqueue_many-array",
        ),
        pytest.param(
            '@schema@.enqueue_many(\'[{"handler": "h"}, {"handler": "h", "payload": null}]\')',
            "job 2 of 2: payload must be a JSON object, not null",
            id="enqueue_many-second-of-two",
        ),
    ],
)
def test_sql_enqueue_refuses_a_payload_that_is_not_an_object(
    test_db_dsn: str, schema: str, conn: psycopg.Connection, call: str, message: str
) -> None:
    before = snapshot(conn, schema)
    # In the caller's own transaction, as an application would.
    with psycopg.connect(test_db_dsn) as tx:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            tx.execute(render(f"SELECT {call}", schema))
        tx.rollback()
    assert message in (info.value.diag.message_primary or "")
    assert snapshot(conn, schema) == before


# -- enqueue bounds: every refusal through SQL, Python and the CLI ------------------------------

# The bounds of pgworkerd.bounds and migration 0004, one wrong field at a time. Each case:
# the job as an enqueue_many object (also the named arguments of enqueue), the JobSpec
# keyword arguments (None: the same as the object; {} when Python cannot express it), the
# extra `pgworkerd enqueue` options, and the message all three paths give.
RANGE = "run_at must be from 1900-01-01 up to (not including) 9000-01-01 UTC"
DELAY_RANGE = "delay must keep run_at from 1900-01-01 up to (not including) 9000-01-01 UTC"


@dataclass(frozen=True)
class BadJob:
    job: dict[str, Any]
    message: str
    python: dict[str, Any] | None = None
    cli: list[str] | None = None

    def spec_kwargs(self) -> dict[str, Any]:
        return dict(self.job) if self.python is None else dict(self.python)


BAD_JOBS = [
    pytest.param(
        BadJob(
            {"handler": "h", "run_at": "-infinity"},
            RANGE,
            {"handler": "h", "run_at": datetime(1899, 12, 31, 23, 59, tzinfo=UTC)},
            ["--run-at", "1899-12-31T23:59:00+0000"],
        ),
        id="run_at-minus-infinity",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "run_at": "infinity"},
            RANGE,
            {"handler": "h", "run_at": datetime(9000, 1, 1, tzinfo=UTC)},
            ["--run-at", "9000-01-01T00:00:00+0000"],
        ),
        id="run_at-infinity",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "run_at": "10000-01-01 00:00+00"},
            RANGE,
            {"handler": "h", "run_at": datetime(9999, 12, 31, tzinfo=UTC)},
            ["--run-at", "9999-12-31T00:00:00+0000"],
        ),
        id="run_at-after-9999",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "run_at": "0044-03-15 12:00+00"},
            RANGE,
            {"handler": "h", "run_at": datetime(44, 3, 15, 12, tzinfo=UTC)},
            ["--run-at", "1850-01-01T00:00:00+0000"],
        ),
        id="run_at-before-1900",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "delay": "7000 years"},
            DELAY_RANGE,
            {"handler": "h", "delay": timedelta(days=7000 * 366)},
            ["--delay", f"{7000 * 366}d"],
        ),
        id="delay-beyond-9000",
    ),
    pytest.param(
        BadJob({"handler": "h", "delay": "-3000 years"}, DELAY_RANGE, {}),
        id="delay-before-1900",
    ),
    pytest.param(
        # now() + delay itself would be out of PostgreSQL's range (before 4713 BC)
        BadJob({"handler": "h", "delay": "-7000 years"}, DELAY_RANGE, {}),
        id="delay-before-4713-bc",
    ),
    pytest.param(
        BadJob({"handler": "h", "delay": "1000000 years"}, DELAY_RANGE, {}),
        id="delay-after-294276",
    ),
    pytest.param(
        # about +97 years in all, but -7000 years on the way (months are added first)
        BadJob({"handler": "h", "delay": "-7000 years 2555000 days"}, DELAY_RANGE, {}),
        id="delay-parts-out-of-range",
    ),
    pytest.param(
        BadJob({"handler": "h", "priority": 32768}, "priority must be an integer from -32768"),
        id="priority-above-smallint",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "priority": -2147483648}, "priority must be an integer from -32768"
        ),
        id="priority-int-min",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "max_attempts": 1001},
            "max_attempts must be a positive integer up to 1000, not 1001",
        ),
        id="max_attempts-1001",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "max_attempts": 2147483647},
            "max_attempts must be a positive integer up to 1000, not 2147483647",
        ),
        id="max_attempts-int-max",
    ),
    pytest.param(BadJob({"handler": "   "}, "handler must not be blank"), id="handler-blank"),
    pytest.param(
        BadJob({"handler": "\u3000\u00a0"}, "handler must not be blank"),
        id="handler-unicode-blank",
    ),
    pytest.param(
        BadJob({"handler": " echo"}, "handler must not begin or end with whitespace"),
        id="handler-leading-space",
    ),
    pytest.param(
        BadJob({"handler": "echo\u2003"}, "handler must not begin or end with whitespace"),
        id="handler-trailing-em-space",
    ),
    pytest.param(
        BadJob(
            {"handler": "echo\x1b]0;PWNED\x07\x1b[2J"},
            "handler must not contain control characters (found U+001B)",
        ),
        id="handler-esc",
    ),
    pytest.param(
        BadJob(
            {"handler": "echo\n  99999 completed default fake_line"},
            "handler must not contain control characters (found U+000A)",
        ),
        id="handler-newline",
    ),
    pytest.param(
        BadJob(
            {"handler": "echo\x7f"}, "handler must not contain control characters (found U+007F)"
        ),
        id="handler-del",
    ),
    pytest.param(
        BadJob(
            {"handler": "echo\x85"}, "handler must not contain control characters (found U+0085)"
        ),
        id="handler-c1",
    ),
    pytest.param(
        BadJob(
            {"handler": "a\u2028b"}, "handler must not contain control characters (found U+2028)"
        ),
        id="handler-line-separator",
    ),
    pytest.param(
        BadJob(
            {"handler": "txt.\u202egpj"},
            "handler must not contain control characters (found U+202E)",
        ),
        id="handler-bidi-override",
    ),
    pytest.param(
        BadJob(
            {"handler": "a\u2066b"}, "handler must not contain control characters (found U+2066)"
        ),
        id="handler-bidi-isolate",
    ),
    pytest.param(
        BadJob({"handler": "h" * 129}, "handler must be at most 128 characters, not 129"),
        id="handler-too-long",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "queue": "default\x1b[31mRED"},
            "queue must not contain control characters (found U+001B)",
        ),
        id="queue-esc",
    ),
    pytest.param(
        BadJob({"handler": "h", "queue": " "}, "queue must not be blank"), id="queue-blank"
    ),
    pytest.param(
        BadJob({"handler": "h", "queue": "mail "}, "queue must not begin or end with whitespace"),
        id="queue-trailing-space",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "queue": "q" * 200}, "queue must be at most 128 characters, not 200"
        ),
        id="queue-too-long",
    ),
    pytest.param(
        BadJob({"handler": "h", "dedupe_key": ""}, "dedupe_key must be 1 to 512 characters, not 0"),
        id="dedupe_key-empty",
    ),
    pytest.param(
        BadJob(
            {"handler": "h", "dedupe_key": "k" * 513},
            "dedupe_key must be 1 to 512 characters, not 513",
        ),
        id="dedupe_key-too-long",
    ),
]

_SQL_TYPES = {
    "handler": "text",
    "queue": "text",
    "priority": "integer",
    "run_at": "timestamptz",
    "delay": "interval",
    "max_attempts": "integer",
    "dedupe_key": "text",
}


@pytest.fixture(scope="module")
def bounds_schema(test_db_dsn: str) -> Iterator[str]:
    """One migrated schema for the whole matrix: a refusal writes nothing, so cases can
    share it (each compares the row counts before and after)."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    migrate(test_db_dsn, schema=name)
    yield name
    drop_schema(test_db_dsn, name)


@pytest.fixture
def bounds_conn(test_db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        yield c


def sql_refusal(dsn: str, statement: str, params: Any) -> psycopg.Error:
    """Run a statement in a transaction of its own, as an application would; the error."""
    with psycopg.connect(dsn) as tx:
        with pytest.raises(psycopg.Error) as info:
            tx.execute(statement, params)
        tx.rollback()
    return info.value


@pytest.mark.parametrize("bad", BAD_JOBS)
def test_sql_functions_refuse_out_of_bounds_jobs_with_22023(
    test_db_dsn: str, bounds_schema: str, bounds_conn: psycopg.Connection, bad: BadJob
) -> None:
    schema = bounds_schema
    before = snapshot(bounds_conn, schema)
    arguments = ", ".join(f"{k} => %({k})s::{_SQL_TYPES[k]}" for k in bad.job)
    calls = [
        # enqueue: the lean single-job path
        (render(f"SELECT @schema@.enqueue({arguments})", schema), bad.job, "job 1 of 1: "),
        # enqueue_many without dedupe keys (a plain insert) ...
        (
            render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
            [json.dumps([bad.job])],
            "job 1 of 1: ",
        ),
        # ... and with one (the ON CONFLICT path): the bad job is the second
        (
            render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
            [json.dumps([{"handler": "h", "dedupe_key": "ok"}, bad.job])],
            "job 2 of 2: ",
        ),
    ]
    for statement, params, position in calls:
        error = sql_refusal(test_db_dsn, statement, params)
        assert error.sqlstate == "22023", (statement, error.sqlstate, str(error))
        assert f"pgworkerd: {position}{bad.message}" in (error.diag.message_primary or ""), (
            statement,
            error.diag.message_primary,
        )
    assert snapshot(bounds_conn, schema) == before


@pytest.mark.parametrize("bad", BAD_JOBS)
def test_python_api_refuses_out_of_bounds_jobs_before_the_database(
    test_db_dsn: str, bounds_schema: str, bounds_conn: psycopg.Connection, bad: BadJob
) -> None:
    kwargs = bad.spec_kwargs()
    if not kwargs:
        pytest.skip("Python cannot express this value (SQL-only case)")
    schema = bounds_schema
    before = snapshot(bounds_conn, schema)
    with psycopg.connect(test_db_dsn) as tx:
        with pytest.raises(client.InvalidJob) as info:
            client.enqueue(tx, schema=schema, **kwargs)
        assert str(info.value).startswith(f"job 1: {bad.message}"), str(info.value)
        with pytest.raises(client.InvalidJob, match=re.escape(f"job 2: {bad.message}")):
            client.enqueue_many(tx, [client.JobSpec("h"), client.JobSpec(**kwargs)], schema=schema)
        # refused before any statement: the caller's transaction is intact
        assert tx.info.transaction_status != psycopg.pq.TransactionStatus.INERROR
        tx.commit()
    assert snapshot(bounds_conn, schema) == before


def _cli_args(bad: BadJob) -> list[str] | None:
    kwargs = bad.spec_kwargs()
    if not kwargs:
        return None
    args = [kwargs.pop("handler")]
    if bad.cli is not None:
        return [*args, *bad.cli]
    for key, value in kwargs.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


@pytest.mark.parametrize("bad", BAD_JOBS)
def test_cli_enqueue_refuses_out_of_bounds_jobs_exit_3(
    test_db_dsn: str, bounds_schema: str, bounds_conn: psycopg.Connection, bad: BadJob
) -> None:
    args = _cli_args(bad)
    if args is None:
        pytest.skip("the command line cannot express this value (SQL-only case)")
    before = snapshot(bounds_conn, bounds_schema)
    proc = cli("--dsn", test_db_dsn, "--schema", bounds_schema, "enqueue", *args)
    assert_refused(proc, ExitCode.CONFIG, f"pgworkerd: {bad.message}")
    assert proc.stdout == ""
    assert snapshot(bounds_conn, bounds_schema) == before


@pytest.mark.parametrize(
    "jobs_json",
    [
        '[{"handler": "h", "payloda": {"x": 1}}]',
        '[{"handler": "h", "dedupe_key": "k", "payloda": {"x": 1}}]',
    ],
    ids=["plain", "with-dedupe-key"],
)
def test_enqueue_many_refuses_an_unknown_key_naming_it(
    test_db_dsn: str, bounds_schema: str, bounds_conn: psycopg.Connection, jobs_json: str
) -> None:
    before = snapshot(bounds_conn, bounds_schema)
    error = sql_refusal(
        test_db_dsn, render("SELECT @schema@.enqueue_many(%s::jsonb)", bounds_schema), [jobs_json]
    )
    assert error.sqlstate == "22023"
    assert 'pgworkerd: job 1 of 1: unknown key "payloda"' in (error.diag.message_primary or "")
    assert snapshot(bounds_conn, bounds_schema) == before


def test_values_at_the_bounds_are_accepted_by_every_path(
    test_db_dsn: str, schema: str, conn: psycopg.Connection
) -> None:
    """The bounds are inclusive where documented so: nothing valid is refused."""
    edge = {
        "handler": "h" * 127 + "\u00e9",
        "queue": "q" * 128,
        "priority": -32768,
        "max_attempts": 1000,
        "dedupe_key": "k" * 512,
        "run_at": "1900-01-01 00:00+00",
    }
    later = {**edge, "priority": 32767, "run_at": "8999-12-31 23:59:59.999999+00"}
    arguments = ", ".join(f"{k} => %({k})s::{_SQL_TYPES[k]}" for k in edge)
    ids = [conn.execute(render(f"SELECT @schema@.enqueue({arguments})", schema), edge).fetchone()]
    ids.append(
        conn.execute(
            render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
            [json.dumps([{**later, "dedupe_key": "other"}, {**later, "dedupe_key": None}])],
        ).fetchone()
    )
    spec = {
        **edge,
        "dedupe_key": "p" * 512,
        "run_at": datetime(8999, 12, 31, 23, 59, tzinfo=UTC),
    }
    client.enqueue(conn, schema=schema, **spec)
    client.enqueue_many(conn, [client.JobSpec(**{**spec, "dedupe_key": None})], schema=schema)
    proc = cli(
        *("--dsn", test_db_dsn, "--schema", schema, "enqueue", edge["handler"]),
        *("--queue", edge["queue"], "--priority", "32767", "--max-attempts", "1000"),
        *("--dedupe-key", "c" * 512, "--run-at", "1900-01-01T00:00:00+0000"),
    )
    assert proc.returncode == 0 and proc.stdout.strip().isdigit(), proc.stderr
    rows = conn.execute(
        render("SELECT priority, max_attempts, handler, queue FROM @schema@.jobs", schema)
    ).fetchall()
    assert len(rows) == 6
    assert {r[0] for r in rows} == {-32768, 32767}
    assert {r[1] for r in rows} == {1000}
    # psycopg loads every one of them (every stored run_at is a Python datetime)
    assert len(admin.list_jobs(conn, schema=schema)) == 6


# -- the database: unreachable, refusing the password, unparsable DSN --------------------------


@pytest.mark.parametrize(
    ("command", "how"),
    [
        pytest.param(["status"], "url", id="status-dsn-url"),
        pytest.param(["show", "1"], "config", id="show-config-dsn"),
        pytest.param(["jobs", "--json"], "env", id="jobs-env-dsn-pgpassword"),
    ],
)
def test_unreachable_database_exits_4_naming_the_target_not_the_password(
    tmp_path: Path, command: list[str], how: str
) -> None:
    port = closed_port()
    env = clean_env()
    if how == "url":
        args = ["--dsn", f"postgresql://app:{PASSWORD}@127.0.0.1:{port}/appdb"]
    elif how == "config":
        config = tmp_path / "pgworkerd.toml"
        config.write_text(
            f'[database]\ndsn = "host=127.0.0.1 port={port} dbname=appdb user=app '
            f"password='{PASSWORD}'\"\n"
        )
        args = ["--config", str(config)]
    else:
        args = []
        env.update(
            PGWORKERD_DSN=f"host=127.0.0.1 port={port} dbname=appdb user=app",
            PGPASSWORD=PASSWORD,
        )
    proc = cli(*args, *command, env=env)
    assert_refused(
        proc, ExitCode.DATABASE, f"cannot connect to PostgreSQL at 127.0.0.1:{port}/appdb"
    )
    assert proc.stdout == ""


@pytest.fixture(scope="module")
def password_role(pg: LocalPostgres) -> Iterator[str]:
    """A role that logs in with a password of its own over TCP (the cluster's passfile
    holds another one): one pg_hba line, for this role only, asks it for scram."""
    role = f"bi_pw_{uuid.uuid4().hex[:8]}"
    hba = pg.data_dir / "pg_hba.conf"
    original = hba.read_text()
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal("the-right-one")
            )
        )
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
        admin.execute("SELECT pg_reload_conf()")

        def refused(password: str) -> bool:
            try:
                psycopg.connect(
                    make_conninfo(pg.tcp_dsn(), user=role, password=password), connect_timeout=5
                ).close()
            except psycopg.OperationalError as exc:
                return "password authentication failed" in str(exc)
            return False

        wait_for(lambda: refused("a-wrong-one"), what="the pg_hba.conf reload")
        assert not refused("the-right-one")
        try:
            yield role
        finally:
            hba.write_text(original)
            admin.execute("SELECT pg_reload_conf()")
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize(
    ("command", "how"),
    [
        pytest.param(["jobs"], "url", id="jobs-dsn-url"),
        pytest.param(["status"], "pgpassword", id="status-pgpassword"),
    ],
)
def test_wrong_password_exits_4_without_printing_it(
    pg: LocalPostgres, test_db_dsn: str, password_role: str, command: list[str], how: str
) -> None:
    env = clean_env()
    if how == "url":
        dsn = f"postgresql://{password_role}:{PASSWORD}@127.0.0.1:{pg.port}/pgworkerd_test"
    else:
        dsn = make_conninfo(pg.tcp_dsn("pgworkerd_test"), user=password_role)
        env["PGPASSWORD"] = PASSWORD
    proc = cli("--dsn", dsn, *command, env=env)
    assert_refused(
        proc,
        ExitCode.DATABASE,
        f"cannot connect to PostgreSQL at 127.0.0.1:{pg.port}/pgworkerd_test",
        f'password authentication failed for user "{password_role}"',
    )


@pytest.mark.parametrize("command", [["jobs"], ["run"]])
def test_unparsable_dsn_is_bad_input_exit_3(command: list[str]) -> None:
    """Not a connection failure: no retry could fix it, so `run` must not retry either."""
    proc = cli("--dsn", f"password={PASSWORD} host=127.0.0.1 port", *command, timeout=DEADLINE)
    assert_refused(proc, ExitCode.CONFIG, "invalid DSN", 'missing "=" after "port"')


def test_run_with_an_invalid_dsn_option_value_exits_3() -> None:
    dsn = f"host=127.0.0.1 port={closed_port()} password={PASSWORD} sslmode=bogus"
    try:
        proc = cli("--dsn", dsn, "run", timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail("`run` still retrying after 8s")
    assert_refused(proc, ExitCode.CONFIG, 'invalid sslmode value: "bogus"')
    # and a daemon started without a config says it has nothing to run
    assert "no handlers configured (no --config or PGWORKERD_CONFIG given)" in proc.stderr


# -- schema missing, older or newer ------------------------------------------------------------

SCHEMA_COMMANDS = {
    "run": ["run"],
    "enqueue": ["enqueue", "h", "--payload", '{"n": 1}'],
    "jobs": ["jobs"],
}


@pytest.mark.parametrize("command", list(SCHEMA_COMMANDS))
@pytest.mark.parametrize("state", ["missing", "older", "newer"])
def test_missing_or_mismatched_schema_exits_5_promptly_and_writes_nothing(
    request: pytest.FixtureRequest,
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection,
    state: str,
    command: str,
) -> None:
    latest = latest_version()
    target = schema
    versions = sql.Identifier(schema, "schema_version")
    if state == "missing":
        target = f"t_{uuid.uuid4().hex[:8]}"
        request.addfinalizer(lambda: drop_schema(test_db_dsn, target))
        expected = f"schema '{target}' does not exist in this database: run `pgworkerd migrate`"
    elif state == "older":
        conn.execute(sql.SQL("DELETE FROM {} WHERE version = %s").format(versions), [latest])
        expected = (
            f"schema '{target}' is at version {latest - 1}, older than this pgworkerd "
            f"expects ({latest}): run `pgworkerd migrate`"
        )
    else:
        conn.execute(
            sql.SQL("INSERT INTO {} (version, name) VALUES (%s, 'from_the_future')").format(
                versions
            ),
            [latest + 1],
        )
        expected = (
            f"schema '{target}' is at version {latest + 1}, newer than this pgworkerd knows "
            f"({latest}): upgrade pgworkerd on this host"
        )
    before = snapshot(conn, target)
    started = time.monotonic()
    # A daemon that retried instead of exiting would run into the timeout.
    proc = cli(
        "--dsn", test_db_dsn, "--schema", target, *SCHEMA_COMMANDS[command], timeout=DEADLINE
    )
    elapsed = time.monotonic() - started
    assert_refused(proc, ExitCode.SCHEMA, expected)
    assert proc.stdout == ""
    assert snapshot(conn, target) == before  # no job, no registry row, versions as they were
    assert elapsed < DEADLINE / 2, f"took {elapsed:.1f}s"


# -- a daemon that cannot reach its database never reports READY ------------------------------


@pytest.mark.parametrize("trouble", ["closed-port", "wrong-password"])
def test_daemon_without_its_database_never_reports_ready(
    request: pytest.FixtureRequest, pg: LocalPostgres, tmp_path: Path, trouble: str
) -> None:
    if trouble == "closed-port":
        port = closed_port()
        dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{port}/appdb"
        expected = [f"127.0.0.1:{port}/appdb"]
    else:
        role = request.getfixturevalue("password_role")
        request.getfixturevalue("test_db_dsn")
        dsn = f"postgresql://{role}:{PASSWORD}@127.0.0.1:{pg.port}/pgworkerd_test"
        expected = [
            f"127.0.0.1:{pg.port}/pgworkerd_test",
            f'password authentication failed for user "{role}"',
        ]
    # A short directory: unix socket paths are limited to ~107 bytes.
    sock_dir = tempfile.mkdtemp(prefix="pgworkerd-bi-", dir="/tmp")
    request.addfinalizer(lambda: shutil.rmtree(sock_dir, ignore_errors=True))
    notify_path = os.path.join(sock_dir, "notify")
    messages: list[str] = []

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(notify_path)

        def receive(seconds: float) -> None:
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    messages.append(sock.recv(65536).decode())
                except TimeoutError:
                    return

        log_path = tmp_path / "daemon.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [str(PGWORKERD), "--dsn", dsn, "run"],
                env=clean_env(NOTIFY_SOCKET=notify_path),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:

            def told_unreachable() -> bool:
                if proc.poll() is not None:
                    pytest.fail(f"daemon exited with {proc.returncode}:\n{log_path.read_text()}")
                receive(0.1)
                return any("STATUS=database unreachable" in m for m in messages)

            wait_for(told_unreachable, what="STATUS=database unreachable")
            receive(3.0)  # the observation window: READY=1 must not come
            assert proc.poll() is None, log_path.read_text()
            lines = [line for m in messages for line in m.splitlines()]
            assert "READY=1" not in lines, messages
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(DEADLINE)
            receive(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    lines = [line for m in messages for line in m.splitlines()]
    assert "READY=1" not in lines, messages
    assert "STOPPING=1" in lines, messages
    # SIGTERM before the database was ever reached: a clean stop, exit 0 (README: "0 success
    # (the daemon: drained and stopped)"); there was nothing to drain.
    assert exit_code == ExitCode.OK
    log = log_path.read_text(errors="replace")
    assert "database unreachable" in log
    for needle in expected:
        assert needle in log, log
    assert PASSWORD not in log
    assert "Traceback" not in log


# -- the demo without a writable /tmp ----------------------------------------------------------


def _can_remount_tmp() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not _can_remount_tmp(),
    reason="needs root and unshare(1) to give the demo a read-only /tmp "
    "(LocalPostgres always uses /tmp, never $TMPDIR)",
)
@pytest.mark.parametrize("args", [["demo", "--seconds", "1"]], ids=["demo"])
def test_demo_without_a_writable_tmp_fails_clearly(args: list[str]) -> None:
    """`demo` puts its throwaway cluster in /tmp (`run` never starts it). With /tmp
    read-only (a private mount namespace) they must say so, not crash; TMPDIR pointing
    nowhere changes nothing, as LocalPostgres ignores it (socket paths must stay short)."""
    # A read-only bind of /tmp onto itself: its contents (maybe this very checkout and its
    # venv) stay visible, nothing can be created there.
    script = 'mount --bind /tmp /tmp && mount -o remount,ro,bind /tmp && exec "$0" "$@"'
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, PGWORKERD, *args],
        capture_output=True,
        text=True,
        env=clean_env(TMPDIR="/nonexistent/tmpdir"),
        stdin=subprocess.DEVNULL,
        timeout=DEADLINE,
        check=False,
    )
    assert_refused(
        proc,
        ExitCode.DATABASE,
        "cannot start a local PostgreSQL for the demo",
        "Read-only file system",
        "/tmp/pgworkerd-pg-",
    )


# -- the command line itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "usage", "error"),
    [
        (["--bogus", "jobs"], "Usage: pgworkerd [OPTIONS] COMMAND [ARGS]...", "'--bogus'"),
        (["run", "--bogus"], "Usage: pgworkerd run [OPTIONS]", "No such option '--bogus'"),
        (["frobnicate"], "Usage: pgworkerd [OPTIONS] COMMAND", "No such command 'frobnicate'"),
    ],
    ids=["global", "run", "unknown-command"],
)
def test_unknown_option_exits_2_with_usage(args: list[str], usage: str, error: str) -> None:
    # A DSN nobody listens on: were the option accepted, `run` must not start the demo.
    dsn = f"postgresql://app@127.0.0.1:{closed_port()}/app"
    proc = cli("--dsn", dsn, *args, timeout=DEADLINE)
    assert_refused(proc, ExitCode.USAGE, usage, error, "--help")
    assert proc.stdout == ""


def test_snapshot_sees_a_written_job(schema: str, conn: psycopg.Connection) -> None:
    """Sanity for `snapshot`, which every case above compares: a job row changes it."""
    before = snapshot(conn, schema)
    client.enqueue(conn, "h", schema=schema)
    assert snapshot(conn, schema) == {**before, "jobs": before["jobs"] + 1}


# -- run_at and delay text enqueue_many cannot read -------------------------------------------

UNREADABLE = "run_at must be a timestamp with a time zone"
UNREADABLE_DELAY = 'delay must be an interval (such as "90 seconds")'


@pytest.mark.parametrize(
    "job, message",
    [
        pytest.param({"run_at": "garbage"}, UNREADABLE, id="run_at-garbage"),
        pytest.param({"run_at": 5}, UNREADABLE, id="run_at-number"),
        pytest.param({"run_at": "2030-02-30T00:00Z"}, UNREADABLE, id="run_at-february-30"),
        pytest.param({"run_at": "2030-13-01"}, UNREADABLE, id="run_at-month-13"),
        pytest.param({"run_at": "0000-01-01"}, UNREADABLE, id="run_at-year-0"),
        pytest.param({"run_at": "2030-01-01T00:00+20:00"}, UNREADABLE, id="run_at-offset-20h"),
        pytest.param(
            {"run_at": "\u0662\u0660\u0663\u0660-01-01"}, UNREADABLE, id="run_at-arabic-digits"
        ),
        pytest.param({"run_at": ["2030-01-01"]}, UNREADABLE, id="run_at-array"),
        pytest.param({"delay": "abc"}, UNREADABLE_DELAY, id="delay-garbage"),
        pytest.param({"delay": "1e30 seconds"}, UNREADABLE_DELAY, id="delay-overflows"),
        pytest.param({"delay": "1e-05 seconds"}, UNREADABLE_DELAY, id="delay-exponent"),
        pytest.param({"delay": True}, UNREADABLE_DELAY, id="delay-boolean"),
    ],
)
@pytest.mark.parametrize("dedupe", [False, True], ids=["plain", "with-dedupe-key"])
def test_enqueue_many_refuses_run_at_or_delay_it_cannot_read(
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection,
    job: dict[str, Any],
    message: str,
    dedupe: bool,
) -> None:
    """Text PostgreSQL cannot read as a timestamp or interval is refused like any other bad
    value (22023, naming the job), not by a failed cast (22007, naming nothing)."""
    jobs_json = [{"handler": "h"}, {"handler": "h", **job}]
    if dedupe:
        jobs_json[1]["dedupe_key"] = "k"
    before = snapshot(conn, schema)
    with psycopg.connect(test_db_dsn) as tx:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            tx.execute(
                render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
                (json.dumps(jobs_json),),
            )
        tx.rollback()
    assert (info.value.diag.message_primary or "").startswith(f"pgworkerd: job 2 of 2: {message}")
    assert snapshot(conn, schema) == before


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_at", "2030-01-31T09:00:00+00:00"),  # Python's isoformat, the fast path
        ("run_at", "2030-02-28 09:00"),
        ("run_at", "Jan 31 2030 09:00 UTC"),  # read by readable(), not the pattern
        ("run_at", None),
        ("delay", "90 seconds"),
        ("delay", "0.00001 seconds"),
        ("delay", "1 hour 30 minutes"),
        ("delay", 5),
        ("delay", None),
    ],
)
def test_enqueue_many_reads_run_at_and_delay_in_any_form_postgres_reads(
    conn: psycopg.Connection, schema: str, field: str, value: Any
) -> None:
    [(ids,)] = conn.execute(
        render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
        (json.dumps([{"handler": "h", field: value}]),),
    ).fetchall()
    assert len(ids) == 1


def test_a_tiny_delay_from_python_is_read_by_enqueue_many(
    conn: psycopg.Connection, schema: str
) -> None:
    """Python writes 0.00001 as 1e-05, which PostgreSQL does not read as an interval."""
    [job_id] = client.enqueue_many(conn, [client.JobSpec("h", delay=0.00001)], schema=schema)
    assert job_id > 0


DEEP_PAYLOAD = '{"a":' * 256 + "1" + "}" * 256  # 256 levels below the top
DEEP_OK = '{"a":' * 255 + "1" + "}" * 255


PAYLOAD_CALLS = {
    "enqueue": "@schema@.enqueue('h', %(payload)s::jsonb)",
    "enqueue-dedupe": "@schema@.enqueue('h', %(payload)s::jsonb, dedupe_key => 'k')",
    "enqueue_many": "@schema@.enqueue_many(jsonb_build_array(jsonb_build_object("
    "'handler', 'h', 'payload', %(payload)s::jsonb)))",
    "enqueue_many-dedupe": "@schema@.enqueue_many(jsonb_build_array(jsonb_build_object("
    "'handler', 'h', 'payload', %(payload)s::jsonb, 'dedupe_key', 'k')))",
}


def refused_payload(
    test_db_dsn: str, schema: str, conn: psycopg.Connection, call: str, payload: str
) -> str:
    """The message of the 22023 error enqueueing `payload` gets; nothing is written."""
    before = snapshot(conn, schema)
    with psycopg.connect(test_db_dsn) as tx:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            tx.execute(render(f"SELECT {call}", schema), {"payload": payload})
        tx.rollback()
    assert snapshot(conn, schema) == before
    return info.value.diag.message_primary or ""


@pytest.mark.parametrize("call", PAYLOAD_CALLS.values(), ids=list(PAYLOAD_CALLS))
def test_enqueue_refuses_a_payload_nested_too_deep(
    test_db_dsn: str, schema: str, conn: psycopg.Connection, call: str
) -> None:
    message = refused_payload(test_db_dsn, schema, conn, call, DEEP_PAYLOAD)
    assert message == "pgworkerd: job 1 of 1: payload must be nested at most 255 levels deep"


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
def test_enqueue_refuses_a_payload_over_64_mib(
    test_db_dsn: str, schema: str, conn: psycopg.Connection, call: str
) -> None:
    payload = '{"s": "' + "x" * (64 * 1024 * 1024) + '"}'
    message = refused_payload(test_db_dsn, schema, conn, PAYLOAD_CALLS[call], payload)
    assert message.startswith("pgworkerd: job 1 of 1: payload must be at most 64 MiB, not 671")


def test_a_payload_just_within_the_bounds_is_enqueued(
    conn: psycopg.Connection, schema: str
) -> None:
    [(job_id,)] = conn.execute(
        render("SELECT @schema@.enqueue('h', %s::jsonb)", schema), (DEEP_OK,)
    ).fetchall()
    assert job_id > 0
    # and from Python: the database's refusal reaches the caller as the same 22023 error
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="255 levels"):
        client.enqueue(conn, "h", json.loads(DEEP_PAYLOAD), schema=schema)


def test_cli_enqueue_refuses_a_payload_nested_too_deep_exit_3(
    test_db_dsn: str, schema: str, conn: psycopg.Connection
) -> None:
    before = snapshot(conn, schema)
    proc = cli("--dsn", test_db_dsn, "--schema", schema, "enqueue", "h", "--payload", DEEP_PAYLOAD)
    assert_refused(proc, ExitCode.CONFIG, "payload must be nested at most 255 levels deep")
    assert snapshot(conn, schema) == before


def test_enqueue_names_the_payload_bound_whatever_the_payload_holds(
    test_db_dsn: str, schema: str, conn: psycopg.Connection
) -> None:
    """Nulls deep inside, or a payload read from a table (stored compressed): the message
    is the bound's, never the catch-all 'is invalid'."""
    deep_with_null = '{"a":' * 256 + "null" + "}" * 256
    message = refused_payload(test_db_dsn, schema, conn, PAYLOAD_CALLS["enqueue"], deep_with_null)
    assert message.endswith("payload must be nested at most 255 levels deep")
    before = snapshot(conn, schema)
    with psycopg.connect(test_db_dsn) as tx:
        tx.execute(
            "CREATE TEMP TABLE big AS"
            " SELECT jsonb_build_object('a', repeat('x', 65 * 1024 * 1024)) AS p"
        )
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            tx.execute(render("SELECT @schema@.enqueue('h', p) FROM big", schema))
        tx.rollback()
    assert "payload must be at most 64 MiB" in (info.value.diag.message_primary or "")
    assert snapshot(conn, schema) == before


@pytest.mark.parametrize("key", ["[]", "[null]", '["k"]', "{}"])
def test_enqueue_many_refuses_a_dedupe_key_that_is_not_a_string(
    test_db_dsn: str, schema: str, conn: psycopg.Connection, key: str
) -> None:
    """Not dropped silently: [] and [null] look like no key to the dedupe path's test."""
    before = snapshot(conn, schema)
    with psycopg.connect(test_db_dsn) as tx:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            tx.execute(
                render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
                (f'[{{"handler": "h", "dedupe_key": {key}}}]',),
            )
        tx.rollback()
    assert info.value.diag.message_primary == "pgworkerd: job 1 of 1: dedupe_key must be a string"
    assert snapshot(conn, schema) == before


def test_enqueue_many_takes_whole_numbers_written_with_a_fraction(
    conn: psycopg.Connection, schema: str
) -> None:
    [(ids,)] = conn.execute(
        render("SELECT @schema@.enqueue_many(%s::jsonb)", schema),
        ('[{"handler": "h", "priority": -3.0, "max_attempts": 7.0}]',),
    ).fetchall()
    [row] = conn.execute(
        render("SELECT priority, max_attempts FROM @schema@.jobs WHERE id = %s", schema), ids
    ).fetchall()
    assert row == (-3, 7)

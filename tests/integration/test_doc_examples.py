"""Every code block of the README and docs/ that can run, run as written, as the role it
names (issue 21, issue 23 item 5; the convention: docs/development/docs.md).

Each block gets its own copy of one database set up the docs' way (the owner migrates the
default `pgworkerd` schema, roles.sql goes through psql unchanged, with its real role names):

- ```sh blocks whose first line names a role of roles.sql (`# as pgworkerd_operator`) and
  that are not a `synopsis` run through bash with `PGWORKERD_DSN` that role's DSN;
- ```sql blocks run as the role their marker names (`<!-- doc: sql as=ROLE -->`; the
  schema's owner without one), in a transaction (`autocommit`: each statement outside
  one, for CREATE INDEX CONCURRENTLY);
- ```python blocks with `module=PATH` are written to PATH and imported; the others run as
  a script as their role, `dsn="…"` in the marker naming the DSN text to replace with the
  role's, `conn` giving them an open connection `conn` (committed at the end).

So an example that needs a right its role lacks, or calls what no longer exists, fails
here. The wait example runs as the enqueuer with a daemon running as pgworkerd_daemon.
What needs no database (TOML, synopses, markers) is checked in tests/unit/test_docs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from daemon_harness import PGWORKERD, Daemons
from doctext import Block, all_blocks
from psycopg import sql

from pgworkerd.devcluster.localpg import LocalPostgres, find_server_bindir

ROLES = ("pgworkerd_daemon", "pgworkerd_enqueuer", "pgworkerd_operator", "pgworkerd_reader")
OWNER = "owner"  # the schema's owner: the database's owner, who migrated
LABEL = re.compile(r"^# as (?P<who>[^\s,:]+)")
BLOCKS = all_blocks()


def shell_role(block: Block) -> str | None:
    """The roles.sql role a ```sh block runs as, if it names one and is meant to run."""
    m = LABEL.match(block.label)
    if m is None or m["who"] not in ROLES or "synopsis" in block.label:
        return None
    return m["who"] if block.kind is None else None


SHELL = [b for b in BLOCKS if b.lang == "sh"]
RUN_SHELL = [b for b in SHELL if shell_role(b) is not None]
RUN_SQL = [b for b in BLOCKS if b.lang == "sql" and b.kind == "sql"]
RUN_PYTHON = [b for b in BLOCKS if b.lang == "python" and b.kind == "python"]
RUN_BY_NAME = [b for b in BLOCKS if b.lang == "python" and b.kind == "by"]


def test_every_shell_example_says_which_role_it_runs_as() -> None:
    unlabelled = [b.where for b in SHELL if not LABEL.match(b.label)]
    assert unlabelled == [], f"shell blocks without '# as ROLE': {unlabelled}"
    named = {shell_role(b) for b in RUN_SHELL}
    assert {"pgworkerd_operator", "pgworkerd_enqueuer", "pgworkerd_reader"} <= named


@pytest.fixture(scope="module")
def docs_template(pg: LocalPostgres) -> Iterator[str]:
    """A database set up as "Install and run" says, once per module: each example gets a
    copy of it (`docs_db`), so no example sees what another left behind."""
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        taken = [
            r[0]
            for r in admin.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [list(ROLES)]
            )
        ]
    assert taken == [], f"roles {taken} exist already in this test cluster"
    name = f"docs_{uuid.uuid4().hex[:8]}"
    pg.create_database(name)
    owner_dsn = pg.dsn(name)
    try:
        # as the schema's owner: create the schema
        migrated = subprocess.run(
            [str(PGWORKERD), "--dsn", owner_dsn, "migrate"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert migrated.returncode == 0, migrated.stderr
        # as a superuser: the docs' line, through psql with ON_ERROR_STOP
        psql = find_server_bindir() / "psql"
        applied = subprocess.run(
            [
                "bash",
                "-euo",
                "pipefail",
                "-c",
                '"$PGWORKERD" files roles.sql | "$PSQL" -X -v ON_ERROR_STOP=1 "$DSN"',
            ],
            env={**os.environ, "PGWORKERD": str(PGWORKERD), "PSQL": str(psql), "DSN": owner_dsn},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
        for role in ROLES:  # the admin's \password, done the test cluster's way
            pg.grant_login(role)
        yield name
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            for role in ROLES:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture
def docs_db(pg: LocalPostgres, docs_template: str) -> Iterator[dict[str, str]]:
    """A fresh copy of the set-up database; yields each role's DSN (they log in with the
    cluster's password, from its passfile), and the owner's."""
    name = f"docs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(docs_template)
            )
        )
    try:
        yield {OWNER: pg.dsn(name), **{role: pg.dsn(name, user=role) for role in ROLES}}
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKERD_", "PG"))}
    env["PATH"] = f"{PGWORKERD.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def run_as(dsn: str, body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["PGWORKERD_DSN"] = dsn
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("block", RUN_SHELL, ids=[b.where for b in RUN_SHELL])
def test_shell_example_runs_as_the_role_it_names(
    docs_db: dict[str, str], block: Block, tmp_path: Path
) -> None:
    role = shell_role(block)
    assert role is not None
    proc = run_as(docs_db[role], block.body, tmp_path)
    assert proc.returncode == 0, (block.label, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "permission denied" not in proc.stderr


@pytest.mark.parametrize("block", RUN_SQL, ids=[b.where for b in RUN_SQL])
def test_sql_example_runs_as_the_role_it_names(docs_db: dict[str, str], block: Block) -> None:
    role = block.options.get("as", OWNER)
    assert role in docs_db, f"{block.where}: as={role} is no role of roles.sql"
    autocommit = "autocommit" in block.marker
    with psycopg.connect(docs_db[role], autocommit=autocommit) as c:
        # a bare client's session: nothing of pgworkerd's on the search path
        c.execute("SET search_path = pg_catalog, pg_temp")
        if autocommit:  # one statement at a time, each outside a transaction
            for statement in filter(str.strip, block.body.split(";\n")):
                c.execute(statement)
        else:
            with c.transaction():
                c.execute(block.body)


@pytest.mark.parametrize("block", RUN_PYTHON, ids=[b.where for b in RUN_PYTHON])
def test_python_example_runs(docs_db: dict[str, str], block: Block, tmp_path: Path) -> None:
    module = block.options.get("module")
    env = clean_env()
    if module is not None:  # a handler module: it must import, as the daemon would
        path = tmp_path / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.body)
        name = module.removesuffix(".py").replace("/", ".")
        env["PYTHONPATH"] = str(tmp_path)
        argv = [sys.executable, "-c", f"import {name}"]
    else:
        dsn = docs_db[block.options.get("as", OWNER)]
        code = block.body
        if "dsn" in block.options:
            placeholder = f'"{block.options["dsn"]}"'
            assert placeholder in code, f"{block.where}: no {placeholder} in the block"
            code = code.replace(placeholder, repr(dsn))
        if "conn" in block.marker:
            code = (
                "import sys\n\nimport psycopg\n\nimport pgworkerd\n"
                "from pgworkerd import JobSpec\n\n"
                "with psycopg.connect(sys.argv[1]) as conn:\n"
                + "".join(f"    {line}\n" if line else "\n" for line in code.splitlines())
            )
        script = tmp_path / "example.py"
        script.write_text(code)
        argv = [sys.executable, str(script), dsn]
    proc = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, (block.where, proc.stdout, proc.stderr)


def test_the_wait_example_runs_as_the_enqueuer(docs_db: dict[str, str], tmp_path: Path) -> None:
    [example] = [
        b for b in BLOCKS if b.lang == "python" and "pgworkerd.wait(conn, job_id" in b.body
    ]
    script = tmp_path / "wait_demo.py"
    script.write_text(example.body)
    daemons = Daemons(tmp_path, docs_db["pgworkerd_daemon"], "pgworkerd")
    try:
        daemons.start({"echo": {"target": "pgworkerd.examples:echo"}})
        proc = subprocess.run(
            [sys.executable, str(script), docs_db["pgworkerd_enqueuer"]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        daemons.stop_all()
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "{'hello': 'world'}\n", "")

"""The README's examples run as written, as the roles they name (issue 21).

Every ```sh block of README.md starts with a line saying which role it runs as
(`# as pgworkerd_operator`). Those naming a role of roles.sql, and not marked `synopsis`,
run here literally: in a database set up the README's way (the owner migrates the default
`pgworkerd` schema, roles.sql goes through psql unchanged, with its real role names), with
`PGWORKERD_DSN` the named role's DSN, as the README says to give it. So an example that
needs a right its role lacks fails here. The Python `wait` example runs as the enqueuer,
with a daemon running as pgworkerd_daemon.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from daemon_harness import PGWORKERD, Daemons
from psycopg import sql

from pgworkerd.devcluster.localpg import LocalPostgres, find_server_bindir

README = Path(__file__).resolve().parents[2] / "README.md"
ROLES = ("pgworkerd_daemon", "pgworkerd_enqueuer", "pgworkerd_operator", "pgworkerd_reader")
LABEL = re.compile(r"^# as (?P<who>[^\s,:]+)")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    lang: str
    label: str  # its first line
    body: str

    @property
    def role(self) -> str | None:
        """The roles.sql role it runs as, if it names one and is meant to run as written."""
        m = LABEL.match(self.label)
        if m is None or m["who"] not in ROLES or "synopsis" in self.label:
            return None
        return m["who"]


def blocks(lang: str) -> list[Block]:
    found, lines = [], README.read_text().split("\n")
    start = None
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            if start is None:
                start = n
            else:
                fence = lines[start - 1][3:].strip()
                if fence == lang:
                    body = "\n".join(lines[start : n - 1])
                    found.append(Block(start, fence, lines[start], body + "\n"))
                start = None
    return found


SHELL = blocks("sh")
RUNNABLE = [b for b in SHELL if b.role is not None]


def test_every_shell_example_says_which_role_it_runs_as() -> None:
    unlabelled = [b.line for b in SHELL if not LABEL.match(b.label)]
    assert unlabelled == [], f"README.md shell blocks without '# as ROLE' (lines {unlabelled})"
    named = {b.role for b in RUNNABLE}
    assert {"pgworkerd_operator", "pgworkerd_enqueuer", "pgworkerd_reader"} <= named


@pytest.fixture
def readme_db(pg: LocalPostgres) -> Iterator[dict[str, str]]:
    """A database set up as the README's "Install and run" says; yields each role's DSN
    (they log in with the cluster's password, from its passfile)."""
    taken = []
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        taken = [
            r[0]
            for r in admin.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [list(ROLES)]
            )
        ]
    assert taken == [], f"roles {taken} exist already in this test cluster"
    name = f"readme_{uuid.uuid4().hex[:8]}"
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
        # as a superuser: the README's line, through psql with ON_ERROR_STOP
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
        yield {role: pg.dsn(name, user=role) for role in ROLES}
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            for role in ROLES:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def run_as(dsn: str, body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKERD_", "PG"))}
    env["PATH"] = f"{PGWORKERD.parent}:{env.get('PATH', '/usr/bin:/bin')}"
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


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"README.md:{b.line}" for b in RUNNABLE])
def test_readme_shell_example_runs_as_the_role_it_names(
    readme_db: dict[str, str], block: Block, tmp_path: Path
) -> None:
    assert block.role is not None
    proc = run_as(readme_db[block.role], block.body, tmp_path)
    assert proc.returncode == 0, (block.label, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "permission denied" not in proc.stderr


def test_readme_wait_example_runs_as_the_enqueuer(
    readme_db: dict[str, str], tmp_path: Path
) -> None:
    [example] = [b for b in blocks("python") if "pgworkerd.wait(conn, job_id" in b.body]
    script = tmp_path / "wait_demo.py"
    script.write_text(example.body)
    daemons = Daemons(tmp_path, readme_db["pgworkerd_daemon"], "pgworkerd")
    try:
        daemons.start({"echo": {"target": "pgworkerd.examples:echo"}})
        proc = subprocess.run(
            [sys.executable, str(script), readme_db["pgworkerd_enqueuer"]],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        daemons.stop_all()
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "{'hello': 'world'}\n", "")

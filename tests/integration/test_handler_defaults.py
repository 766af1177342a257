"""A handler's default dedupe policy (schema 37, handler_defaults; docs/guide/enqueue.md
"Dedupe"), against a real server: an operator sets it with handler_default_set; an
enqueue that names no policy and finds its key held follows it (reject, debounce), one
that names a policy follows its own ("existing" included); the Python API gets it for a
plain `dedupe_key`; removing it restores "existing"; hostile values are refused with
22023 and change nothing; only the operator sets it."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from refusals import may_run

from pgworkerd import client
from pgworkerd.client import DuplicateJob
from pgworkerd.queue.queries import render


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def set_default(conn: psycopg.Connection, schema: str, handler: Any, *args: Any) -> bool:
    placeholders = ", ".join(["%s"] * (1 + len(args)))
    [(present,)] = sql(
        conn, schema, f"SELECT @schema@.handler_default_set({placeholders})", handler, *args
    )
    return bool(present)


def defaults(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    return sql(
        conn,
        schema,
        "SELECT handler, dedupe_policy, debounce_seconds, debounce_max_seconds"
        " FROM @schema@.handler_defaults ORDER BY handler",
    )


def run_at(conn: psycopg.Connection, schema: str, job_id: int) -> Any:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(
            render("SELECT run_at, created_at FROM @schema@.jobs WHERE id = %s", schema),
            (job_id,),
        ).fetchone()
    assert found is not None
    return found


def count_jobs(conn: psycopg.Connection, schema: str) -> int:
    [(n,)] = sql(conn, schema, "SELECT count(*) FROM @schema@.jobs")
    return int(n)


def test_a_reject_default_applies_unless_the_enqueue_names_a_policy(
    conn: psycopg.Connection, schema: str
) -> None:
    holder = client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    # before any default: the holder's id, as always
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) == holder
    assert set_default(conn, schema, "h", "reject") is True
    assert defaults(conn, schema) == [("h", "reject", None, None)]
    # a plain dedupe_key through the Python API: refused, naming the holder
    with pytest.raises(DuplicateJob) as refused:
        client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    assert refused.value.job_id == holder
    # and through SQL (enqueue_v4, enqueue_many_v3), the same
    with pytest.raises(psycopg.Error) as raw:
        sql(conn, schema, "SELECT @schema@.enqueue_v4('h', dedupe_key => 'k')")
    assert raw.value.sqlstate == client.DEDUPE_REJECTED_SQLSTATE
    # an explicit policy wins, "existing" included
    assert client.enqueue(conn, "h", dedupe_key="k", dedupe_policy="existing", schema=schema) == (
        holder
    )
    # another handler's jobs are not concerned; a free key makes a job
    other = client.enqueue(conn, "other", dedupe_key="k", schema=schema)
    assert client.enqueue(conn, "other", dedupe_key="k", schema=schema) == other
    assert client.enqueue(conn, "h", dedupe_key="free", schema=schema) not in (holder, other)
    # the older SQL functions keep their contract: the holder's id
    [(old,)] = sql(conn, schema, "SELECT @schema@.enqueue('h', dedupe_key => 'k')")
    assert old == holder
    # removed: "existing" again
    assert set_default(conn, schema, "h", None) is False
    assert defaults(conn, schema) == []
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) == holder
    assert count_jobs(conn, schema) == 3


def test_a_debounce_default_moves_the_pending_holder_within_its_cap(
    conn: psycopg.Connection, schema: str
) -> None:
    assert set_default(conn, schema, "h", "debounce", timedelta(hours=1), timedelta(hours=2))
    assert defaults(conn, schema) == [("h", "debounce", 3600.0, 7200.0)]
    holder = client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    first = run_at(conn, schema, holder)
    assert first["run_at"] <= first["created_at"] + timedelta(seconds=1)  # its own: now
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) == holder
    moved = run_at(conn, schema, holder)["run_at"]
    assert first["created_at"] + timedelta(minutes=59) < moved
    assert moved <= first["created_at"] + timedelta(hours=2)
    # a job naming its own debounce uses its own figures
    jobs = [
        {
            "handler": "h",
            "dedupe_key": "k",
            "dedupe_policy": "debounce",
            "debounce": 3 * 3600,
            "debounce_max": 4 * 3600,
        }
    ]
    [(ids,)] = sql(conn, schema, "SELECT @schema@.enqueue_many_v3(%s::jsonb)", json.dumps(jobs))
    assert ids == [holder]
    assert run_at(conn, schema, holder)["run_at"] > first["created_at"] + timedelta(hours=2.9)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("h", "sometimes"), 'dedupe_policy must be "existing", "reject" or "debounce"'),
        (("h", "debounce"), 'dedupe_policy "debounce" needs debounce'),
        (("h", "debounce", timedelta(seconds=1)), 'dedupe_policy "debounce" needs debounce_max'),
        (
            ("h", "debounce", timedelta(seconds=-1), timedelta(seconds=5)),
            "debounce must be above 0",
        ),
        (
            ("h", "debounce", timedelta(0), timedelta(seconds=5)),
            "debounce must be above 0",
        ),
        (
            ("h", "debounce", timedelta(seconds=10), timedelta(seconds=5)),
            r"debounce_max \(.*\) must be at least debounce",
        ),
        (
            ("h", "debounce", timedelta(seconds=1), timedelta(days=366)),
            "debounce_max must be above 0 and at most 365 days",
        ),
        (("h", "reject", timedelta(seconds=1)), "debounce and debounce_max go with"),
        (("h", None, timedelta(seconds=1)), "debounce and debounce_max go with"),
        ((None, "reject"), "a handler name is 1 to 128 printable characters"),
        (("", "reject"), "a handler name is 1 to 128 printable characters"),
        (("x" * 129, "reject"), "a handler name is 1 to 128 printable characters"),
        (("h\n", "reject"), "a handler name is 1 to 128 printable characters"),
    ],
)
def test_hostile_defaults_are_refused_with_22023_and_change_nothing(
    conn: psycopg.Connection, schema: str, args: tuple[Any, ...], message: str
) -> None:
    set_default(conn, schema, "h", "reject")
    before = defaults(conn, schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        set_default(conn, schema, *args)
    assert defaults(conn, schema) == before


def test_only_the_operator_sets_handler_defaults(
    conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> None:
    """It sets a handler's default dedupe policy (`handler_default_set`): a bad policy,
    debounce or handler name is refused with 22023 and nothing changes; the reader reads
    the defaults; the enqueuer and the daemon can neither set nor read them, and an
    enqueue that names its own policy is not bound by them."""
    setting = "SELECT @schema@.handler_default_set('h', 'reject')"
    reading = "SELECT * FROM @schema@.handler_defaults"

    def login(kind: str) -> psycopg.Connection:
        return psycopg.connect(roles[f"{schema}_{kind}"], autocommit=True)

    for kind in ("reader", "enqueuer", "daemon"):
        with login(kind) as c:
            assert not may_run(c, schema, setting), kind
            assert may_run(c, schema, reading) == (kind == "reader"), kind
    assert defaults(conn, schema) == []
    with login("operator") as op:
        assert set_default(op, schema, "h", "reject") is True
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            set_default(op, schema, "h", "debounce", timedelta(seconds=-5), timedelta(1))
        assert defaults(op, schema) == [("h", "reject", None, None)]
    with login("enqueuer") as mine:
        held = client.enqueue(mine, "h", dedupe_key="k", schema=schema)
        with pytest.raises(DuplicateJob):
            client.enqueue(mine, "h", dedupe_key="k", schema=schema)
        assert (
            client.enqueue(mine, "h", dedupe_key="k", dedupe_policy="existing", schema=schema)
            == held
        )


# -- pgworkerd handler-default (the CLI over handler_default_set) -----------------------------


def test_the_cli_sets_shows_and_removes_a_default_as_the_operator_only(
    conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> None:
    """`pgworkerd handler-default` as the operator: sets reject, then debounce (shown with
    its figures), removes it (none); what the database refuses is exit 3 and changes
    nothing; the reader shows them, the enqueuer gets the one-line permission error."""
    from clirun import invoke

    def cli(kind: str, *args: str) -> subprocess.CompletedProcess[str]:
        dsn = roles[f"{schema}_{kind}"]
        return invoke("--dsn", dsn, "--schema", schema, "handler-default", *args)

    done = cli("operator", "sync_account", "--dedupe-policy", "reject")
    assert (done.returncode, done.stdout) == (
        0,
        "handler 'sync_account': default dedupe policy reject\n",
    ), done.stderr
    assert defaults(conn, schema) == [("sync_account", "reject", None, None)]
    debounce = ["--dedupe-policy", "debounce", "--debounce", "30s", "--debounce-max", "10m"]
    assert cli("operator", "sync_account", *debounce).returncode == 0
    assert defaults(conn, schema) == [("sync_account", "debounce", 30.0, 600.0)]
    shown = cli("reader", "sync_account")
    assert shown.returncode == 0 and shown.stdout.startswith(
        "sync_account: debounce 30s, at most 10m (set by "
    ), shown.stdout + shown.stderr
    for hostile in (
        ["sync_account", "--dedupe-policy", "debounce"],  # no --debounce
        ["sync_account", "--dedupe-policy", "reject", "--debounce", "5s"],
        ["bad\nname", "--dedupe-policy", "reject"],
        ["x" * 200, "--dedupe-policy", "reject"],
    ):
        refused = cli("operator", *hostile)
        assert refused.returncode == 3, (hostile, refused.stdout, refused.stderr)
        assert refused.stderr.strip(), hostile
    assert cli("operator", "sync_account", "--dedupe-policy", "sometimes").returncode == 2
    assert cli("operator", "--dedupe-policy", "reject").returncode == 2  # no handler
    assert defaults(conn, schema) == [("sync_account", "debounce", 30.0, 600.0)]
    denied = cli("enqueuer", "sync_account", "--dedupe-policy", "reject")
    assert denied.returncode != 0 and "pgworkerd_operator" in denied.stderr, denied.stderr
    gone = cli("operator", "sync_account", "--dedupe-policy", "none")
    assert gone.stdout == "handler 'sync_account': default dedupe policy removed\n"
    assert defaults(conn, schema) == []
    assert cli("reader").stdout == "no handler has a default dedupe policy\n"

"""Fleet-wide limits, concurrency keys and pauses at the SQL level (migration 0009):
claim_v3 holds max_running and max_running_per_key under concurrent claims, a lease that
runs out frees its slot, a blocked handler or key holds up nobody else, paused queues and
handlers are not claimed, and the concurrency key is checked on every enqueue path."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path

import leasing
import psycopg
import pytest
from daemon_harness import Daemons
from psycopg import sql

from pgworkerd import client
from pgworkerd.client import InvalidJob, JobSpec
from pgworkerd.config import ConfigError, parse_config
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import admin, fleet, lease, views
from pgworkerd.queue.lease import HandlerCapacity

Q = ["default"]


def fill(conn: psycopg.Connection, schema: str, specs: list[JobSpec]) -> list[int]:
    return client.enqueue_many(conn, specs, schema=schema)


def claim(
    conn: psycopg.Connection, schema: str, handlers: dict[str, HandlerCapacity], limit: int = 10
) -> list[lease.ClaimedJob]:
    return leasing.claim(conn, "w", queues=Q, handlers=handlers, limit=limit, schema=schema)


def expire(conn: psycopg.Connection, schema: str, ids: list[int]) -> None:
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET locked_until = now() - interval '1 second' WHERE id = ANY(%s)"
        ).format(sql.Identifier(schema)),
        [ids],
    )


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at equal times)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def race(
    dsn: str,
    schema: str,
    capacity: HandlerCapacity,
    *,
    threads: int = 8,
    seconds: float = 4.0,
    hold: float = 0.03,
) -> list[tuple[lease.ClaimedJob, float, float]]:
    """`threads` connections claim one job of handler "h" at a time as fast as they can
    for `seconds`, each holding it for `hold` seconds before completing it. Returns every
    job run with the span it was surely held: from the claim's return (after its commit)
    to before its completion (before that commit), so spans that overlap were held at once."""
    runs: list[tuple[lease.ClaimedJob, float, float]] = []
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait()
                while time.monotonic() < deadline:
                    got = leasing.claim(
                        conn, f"w{n}", queues=Q, handlers={"h": capacity}, limit=1, schema=schema
                    )
                    if not got:
                        continue
                    t0 = time.monotonic()
                    time.sleep(hold)
                    t1 = time.monotonic()
                    assert leasing.complete(conn, f"w{n}", got[0].id, got[0].token, schema=schema)
                    runs.append((got[0], t0, t1))
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    return runs


def test_concurrent_claims_never_exceed_max_running(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    # Without the advisory lock before the count, 8 claimers racing at the limit take a
    # fourth and fifth slot within seconds (each counts the same committed leases).
    fill(conn, schema, [JobSpec("h") for _ in range(3000)])
    runs = race(test_db_dsn, schema, HandlerCapacity(lease_seconds=60, free=1, max_running=3))
    assert len(runs) > 50, "too few claims to show anything"
    assert max_overlap([(t0, t1) for _, t0, t1 in runs]) <= 3
    # and the limit is used, not just respected
    assert max_overlap([(t0, t1) for _, t0, t1 in runs]) == 3


def test_concurrent_claims_never_exceed_max_running_per_key(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    keys = ["a", "b", None]
    fill(conn, schema, [JobSpec("h", concurrency_key=keys[n % 3]) for n in range(3000)])
    runs = race(
        test_db_dsn, schema, HandlerCapacity(lease_seconds=60, free=1, max_running_per_key=2)
    )
    by_key: dict[str | None, list[tuple[float, float]]] = {}
    key_of = dict(
        conn.execute(
            sql.SQL("SELECT id, concurrency_key FROM {}.jobs").format(sql.Identifier(schema))
        ).fetchall()
    )
    for job, t0, t1 in runs:
        by_key.setdefault(key_of[job.id], []).append((t0, t1))
    assert max_overlap(by_key["a"]) <= 2
    assert max_overlap(by_key["b"]) <= 2
    # jobs without a key are not limited by it: more of them than 2 ran at once
    assert max_overlap(by_key[None]) > 2


def test_a_lease_that_runs_out_frees_its_slot(conn: psycopg.Connection, schema: str) -> None:
    first, second = fill(conn, schema, [JobSpec("h"), JobSpec("h")])
    limited = {"h": HandlerCapacity(lease_seconds=60, free=5, max_running=1)}
    assert [j.id for j in claim(conn, schema, limited)] == [first]
    assert claim(conn, schema, limited) == []  # the slot is held
    expire(conn, schema, [first])  # its host was killed: the lease runs out
    [rescued] = claim(conn, schema, limited)
    # the expired job no longer counted; its rescue took the slot like any claim
    assert (rescued.id, rescued.rescued) == (first, True)
    assert claim(conn, schema, limited) == []
    assert leasing.complete(conn, "w", rescued.id, rescued.token, schema=schema)
    assert [j.id for j in claim(conn, schema, limited)] == [second]  # the finish freed it


def test_a_key_slot_returns_when_its_lease_runs_out(conn: psycopg.Connection, schema: str) -> None:
    a1, a2 = fill(conn, schema, [JobSpec("h", concurrency_key="a") for _ in range(2)])
    per_key = {"h": HandlerCapacity(lease_seconds=60, free=5, max_running_per_key=1)}
    assert [j.id for j in claim(conn, schema, per_key)] == [a1]
    assert claim(conn, schema, per_key) == []
    lease.bury(conn, "w", a1, claim_token(conn, schema, a1), "test", schema=schema)
    assert [j.id for j in claim(conn, schema, per_key)] == [a2]


def claim_token(conn: psycopg.Connection, schema: str, job_id: int) -> int:
    [(token,)] = conn.execute(
        sql.SQL("SELECT lease_token FROM {}.jobs WHERE id = %s").format(sql.Identifier(schema)),
        [job_id],
    ).fetchall()
    return int(token)


def test_a_handler_at_its_limit_does_not_hold_up_another(
    conn: psycopg.Connection, schema: str
) -> None:
    fill(conn, schema, [JobSpec("big", priority=-5) for _ in range(200)])
    small = fill(conn, schema, [JobSpec("small") for _ in range(3)])
    both = {
        "big": HandlerCapacity(lease_seconds=60, free=4, max_running=1),
        "small": HandlerCapacity(lease_seconds=60, free=4),
    }
    first = claim(conn, schema, both, limit=4)
    assert sorted(j.handler for j in first) == ["big", "small", "small", "small"]
    assert claim(conn, schema, both, limit=4) == []
    assert {j.id for j in first if j.handler == "small"} == set(small)


def test_a_full_key_does_not_hold_up_other_keys(conn: psycopg.Connection, schema: str) -> None:
    # The full key's backlog is better placed (priority) than everything else: were it
    # filtered after the candidates' LIMIT, a claim would find nothing to run.
    fill(conn, schema, [JobSpec("h", priority=-5, concurrency_key="hot") for _ in range(100)])
    cold = fill(conn, schema, [JobSpec("h", concurrency_key=f"cold{n}") for n in range(3)])
    none = fill(conn, schema, [JobSpec("h")])
    per_key = {"h": HandlerCapacity(lease_seconds=60, free=3, max_running_per_key=2)}
    first = claim(conn, schema, per_key, limit=3)
    # one batch takes no more of a key than it has left (2 of hot), best first
    assert [j.priority for j in first] == [-5, -5, 0]
    second = claim(conn, schema, per_key, limit=3)
    # hot is full: the rest come from behind its backlog
    assert {j.id for j in first + second if j.priority == 0} == set(cold + none)
    assert claim(conn, schema, per_key, limit=3) == []


def test_limits_of_one_batch_stay_within_what_is_left(
    conn: psycopg.Connection, schema: str
) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="k") for _ in range(10)])
    fill(conn, schema, [JobSpec("h") for _ in range(10)])
    capped = {"h": HandlerCapacity(lease_seconds=60, free=10, max_running=4)}
    assert len(claim(conn, schema, capped)) == 4
    both = {"h": HandlerCapacity(lease_seconds=60, free=10, max_running=7, max_running_per_key=1)}
    # 3 left of 7; every claimed job so far was of key k (the oldest first): none left for k
    got = claim(conn, schema, both)
    assert len(got) == 3
    rows = admin.list_jobs(conn, statuses=["running"], schema=schema, limit=100)
    assert len(rows) == 7


def test_claim_with_limits_refuses_a_snapshot_for_the_whole_transaction(
    test_db_dsn: str, schema: str
) -> None:
    with psycopg.connect(test_db_dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        fill(conn, schema, [JobSpec("h")])
        conn.commit()
        with pytest.raises(psycopg.errors.InvalidTransactionState, match="READ COMMITTED"):
            claim(conn, schema, {"h": HandlerCapacity(lease_seconds=60, free=1, max_running=1)})


# -- pauses -----------------------------------------------------------------------------


def test_a_paused_queue_is_not_claimed_until_resumed(conn: psycopg.Connection, schema: str) -> None:
    [mail] = fill(conn, schema, [JobSpec("h", queue="mail")])
    [default] = fill(conn, schema, [JobSpec("h")])
    both = {"h": HandlerCapacity(lease_seconds=60, free=5)}
    assert fleet.set_paused(conn, schema, "queue", "mail", pause=True, comment="migration")
    assert not fleet.set_paused(conn, schema, "queue", "mail", pause=True)  # idempotent
    [row] = views.paused(conn, schema)
    assert (row["kind"], row["name"], row["comment"]) == ("queue", "mail", "migration")
    assert row["paused_by"] == conn.info.user
    queues = ["default", "mail"]
    got = leasing.claim(conn, "w", queues=queues, handlers=both, limit=5, schema=schema)
    assert [j.id for j in got] == [default]
    assert leasing.claim(conn, "w", queues=queues, handlers=both, limit=5, schema=schema) == []
    assert admin.get(conn, mail, schema=schema)["status"] == "pending"  # type: ignore[index]
    assert fleet.set_paused(conn, schema, "queue", "mail", pause=False)
    assert not fleet.set_paused(conn, schema, "queue", "mail", pause=False)
    got = leasing.claim(conn, "w", queues=queues, handlers=both, limit=5, schema=schema)
    assert [j.id for j in got] == [mail]


def test_a_paused_handler_is_not_claimed_nor_rescued(conn: psycopg.Connection, schema: str) -> None:
    running, pending = fill(conn, schema, [JobSpec("h"), JobSpec("h")])
    [other] = fill(conn, schema, [JobSpec("other")])
    caps = {n: HandlerCapacity(lease_seconds=60, free=1) for n in ("h", "other")}
    got = claim(conn, schema, {"h": caps["h"]})
    assert [j.id for j in got] == [running]
    fleet.set_paused(conn, schema, "handler", "h", pause=True)
    expire(conn, schema, [running])  # its daemon died while the handler is paused
    assert [j.id for j in claim(conn, schema, caps)] == [other]
    assert claim(conn, schema, caps) == []
    assert admin.get(conn, pending, schema=schema)["status"] == "pending"  # type: ignore[index]
    fleet.set_paused(conn, schema, "handler", "h", pause=False)
    [rescued] = claim(conn, schema, caps)
    assert (rescued.id, rescued.rescued) == (running, True)


def test_pause_refuses_bad_names_and_kinds(conn: psycopg.Connection, schema: str) -> None:
    for kind, name in [("queue", ""), ("handler", "a\nb"), ("queue", "x" * 129), ("job", "x")]:
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            fleet.set_paused(conn, schema, kind, name, pause=True)
    assert views.paused(conn, schema) == []


def test_pause_and_resume_from_the_command_line(daemons: Daemons) -> None:
    paused = daemons.cli("pause", "--queue", "mail", "--comment", "disk full")
    assert (paused.returncode, paused.stdout) == (0, "paused queue 'mail'\n"), paused.stderr
    again = daemons.cli("pause", "--queue", "mail")
    assert (again.returncode, again.stdout) == (0, "queue 'mail' was already paused\n")
    handler = daemons.cli("pause", "--handler", "export")
    assert handler.returncode == 0, handler.stderr
    status = daemons.cli("status")
    assert "paused (2):" in status.stdout
    assert "queue mail since " in status.stdout and ": disk full" in status.stdout
    shown = json.loads(daemons.cli("status", "--json").stdout)
    assert sorted((p["kind"], p["name"]) for p in shown["paused"]) == [
        ("handler", "export"),
        ("queue", "mail"),
    ]
    resumed = daemons.cli("resume", "--queue", "mail")
    assert (resumed.returncode, resumed.stdout) == (0, "resumed queue 'mail'\n")
    not_paused = daemons.cli("resume", "--queue", "mail")
    assert (not_paused.returncode, not_paused.stdout) == (0, "queue 'mail' was not paused\n")
    assert daemons.cli("pause").returncode == 2  # neither --queue nor --handler
    assert daemons.cli("pause", "--queue", "a", "--handler", "b").returncode == 2
    assert daemons.cli("resume", "--queue", "a", "--all").returncode == 2
    bad = daemons.cli("pause", "--queue", " padded")
    assert bad.returncode == 3 and "whitespace" in bad.stderr
    assert daemons.cli("resume", "--handler", "export").returncode == 0
    assert "paused (0):" in daemons.cli("status").stdout


def test_pausing_what_no_live_daemon_serves_says_so_and_pauses_it(daemons: Daemons) -> None:
    # a typo ("mial") must not look like a pause of "mail"; pausing ahead of time still works
    daemons.start({"export": {"target": "jobhandlers:work", "queue": "mail"}})
    served = daemons.cli("pause", "--queue", "mail")
    assert (served.returncode, served.stdout, served.stderr) == (0, "paused queue 'mail'\n", "")
    handler = daemons.cli("pause", "--handler", "export")
    assert (handler.returncode, handler.stderr) == (0, "")
    typo = daemons.cli("pause", "--queue", "mial")
    assert (typo.returncode, typo.stdout) == (0, "paused queue 'mial'\n")
    assert "no live daemon serves queue 'mial'" in typo.stderr
    other = daemons.cli("pause", "--handler", "exprot")
    assert other.returncode == 0 and "no live daemon serves handler 'exprot'" in other.stderr
    shown = json.loads(daemons.cli("status", "--json").stdout)
    assert len(shown["paused"]) == 4


# -- the concurrency key on every enqueue path ----------------------------------------------

BAD_KEYS: list[tuple[object, str]] = [
    ("", "non-empty"),
    ("x" * 129, "at most 128 characters"),
    ("a\x1bb", "control characters"),
    ("  ", "blank"),
    (" a", "whitespace"),
]


@pytest.mark.parametrize(("key", "message"), BAD_KEYS)
def test_a_bad_concurrency_key_is_refused_on_every_path(
    conn: psycopg.Connection, schema: str, daemons: Daemons, key: str, message: str
) -> None:
    with pytest.raises(InvalidJob, match=message):
        client.enqueue(conn, "h", concurrency_key=key, schema=schema)
    with pytest.raises(InvalidJob, match=f"job 2: concurrency_key must.*{message}"):
        client.enqueue_many(conn, [JobSpec("h"), JobSpec("h", concurrency_key=key)], schema=schema)
    ident = sql.Identifier(schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"job 1 of 1: .*{message}"):
        conn.execute(
            sql.SQL("SELECT {}.enqueue_v2('h', concurrency_key => %s)").format(ident), [key]
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"job 2 of 2: .*{message}"):
        conn.execute(
            sql.SQL("SELECT {}.enqueue_many_v2(%s::jsonb)").format(ident),
            [json.dumps([{"handler": "h"}, {"handler": "h", "concurrency_key": key}])],
        )
    cli = daemons.cli("enqueue", "h", "--concurrency-key", key)
    assert cli.returncode == 3 and message in cli.stderr, cli.stderr
    [(n,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(ident)).fetchall()
    assert n == 0  # nothing was written


def test_a_concurrency_key_of_another_type_is_refused(
    conn: psycopg.Connection, schema: str
) -> None:
    ident = sql.Identifier(schema)
    for bad in (1, ["a"], {"a": 1}, True):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be a string"):
            conn.execute(
                sql.SQL("SELECT {}.enqueue_many_v2(%s::jsonb)").format(ident),
                [json.dumps([{"handler": "h", "concurrency_key": bad}])],
            )
    with pytest.raises(InvalidJob, match="concurrency_key must be a non-empty string"):
        client.enqueue(conn, "h", concurrency_key=7, schema=schema)  # type: ignore[arg-type]
    # the old enqueue_many does not know the key (and says which keys it knows)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='unknown key "concurrency'):
        conn.execute(
            sql.SQL("SELECT {}.enqueue_many(%s::jsonb)").format(ident),
            ['[{"handler": "h", "concurrency_key": "a"}]'],
        )


def test_the_concurrency_key_lands_from_every_path_and_is_shown(
    conn: psycopg.Connection, schema: str, daemons: Daemons
) -> None:
    ident = sql.Identifier(schema)
    py_one = client.enqueue(conn, "h", {"n": 1}, concurrency_key="py", schema=schema)
    py_many = client.enqueue_many(
        conn, [JobSpec("h", concurrency_key="many"), JobSpec("h")], schema=schema
    )
    conn.execute("SET intervalstyle = 'sql_standard'")  # the delay survives any style
    [(sql_one,)] = conn.execute(
        sql.SQL(
            "SELECT {}.enqueue_v2('h', '{{}}', delay => '90 seconds', concurrency_key => 'sql')"
        ).format(ident)
    ).fetchall()
    [(sql_many,)] = conn.execute(
        sql.SQL("SELECT {}.enqueue_many_v2(%s::jsonb)").format(ident),
        ['[{"handler": "h", "concurrency_key": "sqlm", "dedupe_key": "d"}]'],
    ).fetchall()
    # a dedupe key finds the live job and keeps its key
    [(again,)] = conn.execute(
        sql.SQL("SELECT {}.enqueue_v2('h', dedupe_key => 'd', concurrency_key => 'other')").format(
            ident
        )
    ).fetchall()
    assert again == sql_many[0]
    out = daemons.cli("enqueue", "h", "--concurrency-key", "cli")
    assert out.returncode == 0, out.stderr
    cli_id = int(out.stdout)
    keys = dict(
        conn.execute(sql.SQL("SELECT id, concurrency_key FROM {}.jobs").format(ident)).fetchall()
    )
    assert keys == {
        py_one: "py",
        py_many[0]: "many",
        py_many[1]: None,
        sql_one: "sql",
        sql_many[0]: "sqlm",
        cli_id: "cli",
    }
    [(gap,)] = conn.execute(
        sql.SQL(
            "SELECT extract(epoch FROM run_at - created_at)::float8 FROM {}.jobs WHERE id = %s"
        ).format(ident),
        [sql_one],
    ).fetchall()
    assert gap == 90.0
    shown = json.loads(daemons.cli("show", str(cli_id), "--json").stdout)
    assert shown["concurrency_key"] == "cli"
    listed = json.loads(daemons.cli("jobs", "--json").stdout)
    assert {r["id"]: r["concurrency_key"] for r in listed} == keys


# -- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "must be at least 1"),
        ("-2", "must be at least 1"),
        ('"2"', "expected an integer"),
        ("true", "expected an integer"),
        ("1.5", "expected an integer"),
        ("2147483648", "at most 2147483647"),
    ],
)
@pytest.mark.parametrize("key", ["max_running", "max_running_per_key"])
def test_limits_in_the_config_are_positive_integers(key: str, value: str, message: str) -> None:
    text = f'[handlers.export]\ntarget = "m:f"\n{key} = {value}\n'
    with pytest.raises(ConfigError, match=rf"^cfg.toml:3: handlers\.export\.{key}: .*{message}"):
        parse_config(text, "cfg.toml")
    good = parse_config(f'[handlers.export]\ntarget = "m:f"\n{key} = 3\n', "cfg.toml")
    assert getattr(good.handlers["export"], key) == 3


# -- README examples, run as written --------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(lang: str, after: str) -> str:
    """The first ```lang block of the README after the line starting with `after`."""
    text = README.read_text()
    start = text.index(f"\n{after}")
    match = re.search(rf"\n```{lang}\n(.*?)\n```\n", text[start:], re.S)
    assert match, f"no {lang} block after {after!r}"
    return match.group(1)


def test_readme_sql_examples_of_keys_and_pauses(pg: LocalPostgres) -> None:
    from pgworkerd.queue.migrate import migrate

    name = f"readme_{uuid.uuid4().hex[:8]}"
    pg.create_database(name)
    try:
        migrate(pg.dsn(name))  # the default schema, as the README has it
        with psycopg.connect(pg.dsn(name), autocommit=True) as c:
            c.execute(readme_block("sql", "The key comes from every enqueue path"))
            keys = c.execute("SELECT concurrency_key FROM pgworkerd.jobs ORDER BY id").fetchall()
            assert keys == [("customer:42",), ("customer:42",), ("customer:7",)]
            pauses = readme_block("sql", "### Pause and resume a queue or handler")
            c.execute(pauses)  # pause, resume, pause, resume: nothing left paused
            assert c.execute("SELECT count(*) FROM pgworkerd.paused").fetchone() == (0,)
            for line in pauses.splitlines():  # the pauses alone
                if line.startswith("SELECT pgworkerd.pause_"):
                    c.execute(line)
            assert c.execute(
                "SELECT kind, name, comment FROM pgworkerd.paused ORDER BY kind"
            ).fetchall() == [("handler", "export", None), ("queue", "mail", "smtp relay down")]
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

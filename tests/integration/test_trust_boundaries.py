"""docs/operations/trust-boundaries.md, "Who can do what": each item is held by a test. The tests
here carry their item as their docstring, word for word; items that tests elsewhere
already hold are listed in ELSEWHERE. test_every_item_of_who_can_do_what_has_its_test
keeps the page and the tests in step.

The roles' tests run against a real cluster with roles.sql applied (the `roles` fixture):
what must fail is tried as the role and fails with a permission error, what must work is
done as the role. Items marked "Not protected" are gaps of today, held as gaps: a test
that the gap is there, to be turned round by the work that closes it (the page's
`<!-- lockdown: ... -->`, `<!-- jobuids: ... -->`, `<!-- gilfence: ... -->` notes)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import leasing
import psycopg
import pytest
from daemon_harness import DEADLINE, PGWORKERD, Daemons, Db, wait_for
from psycopg import sql
from psycopg.types.json import Jsonb
from refusals import may_run, refused, runnable
from roles_harness import drop_roles

import pgworkerd
from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.queries import query, render

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "trust-boundaries.md"

# Items held by tests in other files: item -> ["path::test", ...].
ELSEWHERE: dict[str, list[str]] = {
    "It holds a dedupe key for at most 365 days after its job finished (`dedupe_window`), and"
    " its debounce moves only a pending job its own login enqueued, never past that job's"
    " enqueue + the `debounce_max` it gives (at most 365 days): another login's job holding"
    " the key is returned unchanged.": [
        "tests/integration/test_dedupe_windows.py"
        "::test_an_enqueuer_debounces_only_its_own_logins_jobs_within_a_year",
    ],
    "It enqueues batches ([Batches](../guide/batches.md): at most 100,000 members and one"
    " callback, in one transaction) and pages the members' outcomes only of a batch whose"
    " callback its own login enqueued: another login's batch is refused as unknown, and it"
    " cannot read the batches table.": [
        "tests/integration/test_batches_sql.py"
        "::test_an_enqueuer_enqueues_batches_and_pages_only_its_own",
    ],
    "It makes a job wait for parents (`after`) only among the jobs its own login enqueued:"
    " another login's job is refused as unknown, so no child of its own is handed another"
    " application's result.": [
        "tests/integration/test_dependencies_sql.py"
        "::test_an_enqueuer_cannot_name_another_logins_job_as_a_parent",
    ],
    "It sets the priority of at most 1,000 pending, waiting or suspended jobs at once"
    " (`job_priority_set`, the dashboard's bulk action): an empty or longer selection, a NULL"
    " id or a priority out of range is refused with 22023 and nothing changes; running and"
    " finished jobs keep theirs; the reader, the enqueuer and the daemon cannot call it.": [
        "tests/web/test_console_bulk.py::test_only_the_operator_sets_priorities_within_bounds",
    ],
    "It sets a handler's default dedupe policy (`handler_default_set`): a bad policy,"
    " debounce or handler name is refused with 22023 and nothing changes; the reader reads"
    " the defaults; the enqueuer and the daemon can neither set nor read them, and an"
    " enqueue that names its own policy is not bound by them.": [
        "tests/integration/test_handler_defaults.py::test_only_the_operator_sets_handler_defaults",
    ],
    "It releases a job held after a parent failed (`pgworkerd release`), and only such a"
    " job: any other id is refused with 22023 and nothing changes; the enqueuer and the"
    " daemon cannot release at all.": [
        "tests/integration/test_dependencies_sql.py::test_only_the_operator_releases_a_held_job",
    ],
    "It cannot connect to a throwaway cluster (the demo's or the tests') nor read its files.": [
        "tests/integration/test_localpg.py::test_another_local_user_cannot_connect",
        "tests/integration/test_localpg.py::test_cluster_files_are_private",
        "tests/integration/test_localpg.py::test_demo_is_private_and_never_shows_its_password",
    ],
    "It sees every pgworkerd process's title (worker id, handler, job id), and a password"
    " given with `--dsn` only before the daemon masks it (well under 1 s; keep passwords out"
    " of argv).": [
        "tests/acceptance/test_daemon.py::test_process_titles_and_registry_row",
        "tests/acceptance/test_daemon.py::test_a_dsn_password_is_masked_in_the_process_title_at_once",
    ],
    "Holding the GIL in C code does not keep it running: a watcher process outside its"
    " interpreter stops its whole tree at its lease deadline and at its memory limit. The"
    " watcher learns each renewal on a socket of its own whose other end only the daemon"
    " holds, so a job cannot move its own deadline (nor read the watcher's renewals: the"
    " child closes its copy of the watcher's end before any handler code runs).": [
        "tests/fault/test_containment.py"
        "::test_a_handler_holding_the_gil_is_stopped_at_its_lease_deadline_with_its_tree",
        "tests/acceptance/test_accounting.py"
        "::test_a_handler_holding_the_gil_is_stopped_near_its_memory_limit",
        "tests/fault/test_containment.py"
        "::test_a_handler_that_forges_renewals_is_stopped_at_its_lease_deadline",
    ],
    "It changes a job only through fenced functions that check its worker, lease token and"
    " `running`: no UPDATE of status, attempts, checkpoint or result, no other worker's logs"
    " or attempt figures, no schedule declared or fired with its own job, no prune below the"
    " operator's floor; every statement of the audit's daemon probe is refused.": [
        "tests/integration/test_roles.py"
        "::test_the_audits_daemon_role_probe_is_refused_statement_by_statement",
    ],
    "With `[worker] job_uids` (see [Per-job uids](per-job-uids.md)) it runs as a uid of its"
    " own: it cannot write into another job's output, read another job's environment or temp"
    " directory, signal another job, the daemon or the fork server, nor read the daemon's"
    " config; its handler module's import still ran as the daemon's user.": [
        "tests/fault/test_job_uids.py"
        "::test_with_job_uids_no_attack_of_the_audit_reaches_another_job_or_the_daemon",
    ],
    "It cannot enter the daemon's directory of per-attempt temp directories (0700), nor,"
    " with `job_uids` (which makes that directory 0711), a job user's own directory in it"
    " (0700).": [
        "tests/fault/test_job_uids.py"
        "::test_with_job_uids_no_attack_of_the_audit_reaches_another_job_or_the_daemon",
        "tests/fault/test_containment.py"
        "::test_the_temp_directories_of_a_daemon_killed_9_go_at_the_next_start",
    ],
    "It reads the metrics endpoint when one is configured: it has no login.": [
        "tests/integration/test_daemon_metrics.py::test_metrics_follow_the_jobs",
    ],
    "Without users in the config the dashboard does not start, unless `--no-login` says so,"
    " and then it says at start that everyone who can reach the address acts with its"
    " database role: on loopback, every account and every job on the host.": [
        "tests/web/test_web_cli.py::test_without_users_the_dashboard_does_not_start",
        "tests/web/test_web_cli.py::test_no_login_is_explicit_and_loud",
    ],
    "With users, every page needs a login; failed logins are throttled per name (from any"
    " address) and per address without holding a server thread, and a browser that logged"
    " in as a user before still logs in while someone guesses that user's password; logout"
    " and idleness end a session on the server.": [
        "tests/web/test_dashboard_trust.py"
        "::test_a_name_guessed_from_rotating_addresses_gets_only_its_budget",
        "tests/web/test_dashboard_trust.py::test_a_real_user_logs_in_while_their_name_is_guessed",
        "tests/web/test_dashboard_security.py::test_without_a_login_every_page_is_refused",
        "tests/web/test_dashboard_trust.py::test_a_locked_name_is_locked_from_its_address_only",
        "tests/web/test_dashboard_trust.py::test_one_address_cannot_try_many_names",
        "tests/web/test_dashboard_trust.py::test_guessing_holds_no_server_thread",
        "tests/web/test_dashboard_trust.py::test_logout_ends_the_session_on_the_server",
        "tests/web/test_dashboard_trust.py::test_an_idle_session_ends",
    ],
    "With `--read-only` it offers and accepts no action (give it `pgworkerd_reader`).": [
        "tests/web/test_dashboard_security.py::test_read_only_mode_offers_and_accepts_no_action",
        "tests/web/test_dashboard_roles.py"
        "::test_every_page_serves_as_the_reader_and_actions_work_as_the_operator",
    ],
    "It sees no `PG*` variable and none of the daemon's credentials in its environment.": [
        "tests/acceptance/test_daemon.py::test_job_children_never_see_the_daemons_credentials",
    ],
    "It can make its own transaction's writes conditional on a job's lease"
    " (`job_lease_assert`) only with the lease token that job's running attempt was given:"
    " any other token, a finished job or an unknown id is refused (SQLSTATE `PGWL1`, naming"
    " no token), and with the token it holds the job's row until that transaction ends (no"
    " rescue takes the lease meanwhile; keep the transaction short).": [
        "tests/integration/test_follow_ups_sql.py"
        "::test_the_enqueuer_asserts_a_lease_only_with_its_token",
    ],
    "It enqueues follow-up jobs only with the fenced completion of a job it holds (its"
    " worker, lease token and `running`), in that completion's transaction, each list"
    " through the enqueue checks and the bounds of its own login: without the job's lease it"
    " inserts nothing and learns nothing, and a completed job's follow-ups are never"
    " inserted again.": [
        "tests/integration/test_follow_ups_sql.py"
        "::test_the_daemon_enqueues_follow_ups_only_for_a_job_it_holds",
    ],
    "It is given its attempt's lease token (`job.lease_token`), a capability for"
    " `job_lease_assert`: pgworkerd passes it to the child only, never in its log, a process"
    " title, an error, `pgworkerd show` or a dashboard page or link; once the attempt has"
    " lost the job, the token opens nothing.": [
        "tests/fault/test_follow_ups_faults.py"
        "::test_a_token_handed_out_is_fenced_after_a_rescue_and_never_logged",
        "tests/integration/test_follow_ups_sql.py::test_show_never_prints_a_lease_token",
        "tests/web/test_dashboard_bounds.py::test_big_logs_are_cut_with_a_download",
        "tests/web/test_dashboard_follow_ups.py"
        "::test_a_job_page_links_its_follow_ups_and_a_follow_up_its_job",
    ],
    "Nothing it starts outlives its attempt, and its temp directory goes with the attempt.": [
        "tests/fault/test_containment.py::test_nothing_a_job_started_outlives_its_attempt",
    ],
}


def normal(text: str) -> str:
    return " ".join(text.split())


def readme_items() -> list[str]:
    """The bullet items of "Who can do what", each joined into one line."""
    text = PAGE.read_text()
    start = text.index("\n## Who can do what\n")
    section = text[start : text.index("\n## ", start + 1)]
    items: list[str] = []
    in_item = False
    for line in section.splitlines():
        if line.startswith("- "):
            items.append(line[2:])
            in_item = True
        elif in_item and line.startswith("  "):
            items[-1] += " " + line.strip()
        else:
            in_item = False  # a blank line or a paragraph ends an item
    return [normal(i) for i in items]


def docstrings_of_tests(path: Path) -> dict[str, str | None]:
    """Test functions of a file: name -> docstring."""
    tree = ast.parse(path.read_text())
    return {
        n.name: ast.get_docstring(n)
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }


def test_every_item_of_who_can_do_what_has_its_test() -> None:
    items = readme_items()
    assert len(items) >= 25 and len(set(items)) == len(items)
    here = {normal(doc) for doc in docstrings_of_tests(Path(__file__)).values() if doc}
    elsewhere = {normal(k): v for k, v in ELSEWHERE.items()}
    assert [i for i in items if i not in here and i not in elsewhere] == [], "items untested"
    # and no test holds an item the page no longer makes
    assert [d for d in (*here, *elsewhere) if d not in items] == [], "stale tests"
    for refs in elsewhere.values():
        for ref in refs:
            path, name = ref.split("::")
            assert name in docstrings_of_tests(ROOT / path), ref


# -- helpers --------------------------------------------------------------------------------


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


def as_role(roles: dict[str, str], schema: str, kind: str) -> psycopg.Connection:
    return connect(roles[f"{schema}_{kind}"])


def claim_all(conn: psycopg.Connection, schema: str, **capacity: Any) -> list[lease.ClaimedJob]:
    return leasing.claim(
        conn,
        "w",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(60, 10, **capacity)},
        limit=10,
        schema=schema,
    )


def jobs_table(schema: str) -> sql.Composable:
    return sql.Identifier(schema, "jobs")


# -- pgworkerd_enqueuer ----------------------------------------------------------------------


def test_the_enqueuer_enqueues_any_handler_into_any_queue(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It enqueues jobs for any handler, into any queue, with any payload the bounds at
    enqueue accept."""
    with as_role(roles, schema, "enqueuer") as c:
        job = client.enqueue(
            c, "another_apps_handler", {"to": "x"}, queue="another-apps-queue", schema=schema
        )
        deep: dict[str, Any] = {}
        for _ in range(300):
            deep = {"a": deep}
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested at most 255"):
            c.execute(render("SELECT @schema@.enqueue('h', %s)", schema), [Jsonb(deep)])
    row = conn.execute(
        sql.SQL("SELECT handler, queue, payload FROM {} WHERE id = %s").format(jobs_table(schema)),
        [job],
    ).fetchone()
    assert row == ("another_apps_handler", "another-apps-queue", {"to": "x"})


def test_the_enqueuer_chooses_any_priority_unless_bounded(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It chooses any priority from -32768 to 32767, and a job at -32768 is claimed before
    every other due job, unless an enqueue bound narrows its range."""
    others = [client.enqueue(conn, "h", schema=schema) for _ in range(3)]
    with as_role(roles, schema, "enqueuer") as c:
        jumper = client.enqueue(c, "h", priority=-32768, schema=schema)
    [first] = leasing.claim(
        conn,
        "w",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(60, 1)},
        limit=1,
        schema=schema,
    )
    assert first.id == jumper and jumper > max(others)
    with as_role(roles, schema, "operator") as op:
        op.execute(
            render(
                "INSERT INTO @schema@.enqueue_bounds (role_name, priority_min) VALUES (%s, 0)",
                schema,
            ),
            [f"{schema}_enqueuer"],
        )
    with (
        as_role(roles, schema, "enqueuer") as c,
        refused(conn, schema, match=r"priority -32768 is outside 0\.\.32767"),
    ):
        client.enqueue(c, "h", priority=-32768, schema=schema)


def test_the_enqueuer_can_use_other_applications_keys_unless_bounded(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It can use any concurrency key and any dedupe key of any handler it names, unless an
    enqueue bound gives it prefixes: its job holding another application's concurrency key
    keeps that application's jobs with the key waiting, and another application's live
    dedupe key under the same handler gives it that job's id instead of a new job."""
    per_key = {"max_running_per_key": 1}
    with as_role(roles, schema, "enqueuer") as c:
        squat = client.enqueue(c, "h", concurrency_key="customer:42", schema=schema)
    assert [j.id for j in claim_all(conn, schema, **per_key)] == [squat]  # it runs
    app = client.enqueue(conn, "h", concurrency_key="customer:42", schema=schema)
    assert claim_all(conn, schema, **per_key) == []  # the application's job waits
    theirs = client.enqueue(
        conn, "h", {"to": "a@example.com"}, dedupe_key="welcome:43", schema=schema
    )
    with as_role(roles, schema, "enqueuer") as c:
        assert (
            client.enqueue(c, "h", {"to": "evil"}, dedupe_key="welcome:43", schema=schema) == theirs
        )
    with as_role(roles, schema, "operator") as op:
        op.execute(
            render(
                "INSERT INTO @schema@.enqueue_bounds (role_name, dedupe_key_prefix,"
                " concurrency_key_prefix) VALUES (%s, 'shop:', 'shop:')",
                schema,
            ),
            [f"{schema}_enqueuer"],
        )
    with as_role(roles, schema, "enqueuer") as c:
        for keys in ({"concurrency_key": "customer:42"}, {"dedupe_key": "welcome:43"}):
            with refused(conn, schema, match="must start with 'shop:'"):
                client.enqueue(c, "h", schema=schema, **keys)
    assert app > squat


def test_the_enqueuer_has_no_quota(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It has no quota: one call enqueues as many jobs as its 30 s statement timeout
    allows."""
    with as_role(roles, schema, "enqueuer") as c:
        assert c.execute("SHOW statement_timeout").fetchone() == ("30s",)
        ids = client.enqueue_many(c, [client.JobSpec("h") for _ in range(20_000)], schema=schema)
    assert len(ids) == 20_000
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(jobs_table(schema)))
    assert count.fetchone() == (20_000,)


def test_the_enqueuer_reads_its_own_jobs_only(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It reads and waits for the jobs its own login enqueued, and gets no row for any other
    job, as for an id that does not exist."""
    other = client.enqueue(conn, "h", {"secret": 1}, schema=schema)
    with as_role(roles, schema, "enqueuer") as c:
        own = client.enqueue(c, "h", schema=schema)
        found = pgworkerd.get(c, own, schema=schema)
        assert found is not None and found.id == own
        assert pgworkerd.get(c, other, schema=schema) is None
        assert pgworkerd.get(c, other + 1000, schema=schema) is None
        with pytest.raises(pgworkerd.JobNotFound):
            pgworkerd.wait(c, other, timeout=2, schema=schema)


# The 2026-11-26 audit's enqueuer_probe.sql (security-2026-11-26-repro), statement by
# statement, and the enqueue bounds since.
ENQUEUER_PROBE = [
    "SELECT @schema@.pause_queue('default', 'by the enqueuer')",
    "SELECT @schema@.pause('handler', 'echo')",
    "SELECT @schema@.resume_queue('default')",
    "INSERT INTO @schema@.paused(kind, name) VALUES ('queue', 'default')",
    "SELECT @schema@.schedule_declare('flood', '{\"handler\":\"echo\",\"every\":1}', 'enq')",
    "SELECT @schema@.schedule_fire('flood', now(), '{\"handler\":\"echo\"}', 'allow', 'enq')",
    "SELECT @schema@.schedule_runs_prune('0 s')",
    "INSERT INTO @schema@.schedules(name, definition, declared_by) VALUES ('x', '{}', 'enq')",
    "SELECT count(*) FROM @schema@.schedules",
    "SELECT * FROM @schema@.claim_v3('enq', '{default}', '{echo}', '{60}', '{1}', 1, NULL,"
    " NULL, '{0}', NULL)",
    'UPDATE @schema@.workers SET handler_settings = \'{"echo":{"max_running":0}}\'',
    "INSERT INTO @schema@.workers(id, host, pid) VALUES ('enq:1:x', 'h', 1)",
    "SELECT * FROM @schema@.prune_finished_v1(0, 0, 0, 10000)",
    "INSERT INTO @schema@.attempts(job_id, lease_token, attempt, outcome)"
    " VALUES (1, 999, 1, 'completed')",
    "SELECT count(*) FROM @schema@.attempts",
    "SELECT count(*) FROM @schema@.job_logs",
    "INSERT INTO @schema@.job_logs(job_id, lease_token, attempt, worker, head)"
    " VALUES (1, 999, 1, 'x', 'forged')",
    "SELECT @schema@.complete_job(1, 'w', 1, '{}')",
    "SELECT * FROM @schema@.snooze_job(1, 'w', 1, 0)",
    "SELECT @schema@.give_up_job(1, 'w', 1, 'x')",
    "SELECT count(*) FROM @schema@.jobs",
    "UPDATE @schema@.jobs SET status = 'dead' WHERE id = 1",
    # since: the registry's drains, the claim of every language, the enqueue bounds
    "SELECT @schema@.drain_request(NULL, NULL, false, NULL, NULL, NULL)",
    "SELECT * FROM @schema@.claim_jobs('enq', '{default}', '{echo}', '{60}', '{1}', 1,"
    " NULL, NULL, NULL, NULL)",
    "SELECT * FROM @schema@.enqueue_bounds",
    "INSERT INTO @schema@.enqueue_bounds (role_name) VALUES (NULL)",
    "DELETE FROM @schema@.enqueue_bounds",
]


def test_the_enqueuer_probe_is_refused(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It cannot read or write the tables (jobs, attempts, logs, registry, pauses,
    schedules, enqueue bounds), nor pause, drain, declare or fire schedules, claim, finish
    or prune: every statement of the 2026-11-26 audit's enqueuer probe is refused."""
    client.enqueue(conn, "h", schema=schema)  # job 1, so that the statements touch a row
    with as_role(roles, schema, "enqueuer") as c:
        assert runnable(c, schema, ENQUEUER_PROBE) == []
    assert runnable(conn, schema, ENQUEUER_PROBE[:3]) == ENQUEUER_PROBE[:3]  # real statements


# -- pgworkerd_daemon ------------------------------------------------------------------------


def test_the_daemon_runs_its_claims(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It claims, renews and finishes jobs, and writes its registry row, job logs and
    attempt figures."""
    job = client.enqueue(conn, "h", schema=schema)
    with as_role(roles, schema, "daemon") as c:
        [held] = claim_all(c, schema)
        worker = "w"
        [renewed] = lease.renew(c, worker, [lease.Lease(held.id, held.token, 60)], schema=schema)
        assert renewed.renewed
        c.execute(
            query("worker_register", schema),
            {
                "id": "h:1:abc",
                "secret": "s" * 32,
                "host": "h",
                "pid": 1,
                "version": "0",
                "queues": ["default"],
                "handlers": ["h"],
                "slots": 1,
                "state": "running",
                "settings": "{}",
                "heartbeat_interval": 10.0,
            },
        )
        logged = c.execute(
            query("job_log_write", schema),
            {
                "worker": worker,
                "ids": [held.id],
                "tokens": [held.token],
                "attempts": [1],
                "heads": ["hello"],
                "tails": [""],
                "totals": [5],
                "omitted": [0],
                "finished": [True],
            },
        ).fetchall()
        assert logged == [(job,)]
        assert leasing.complete(c, worker, held.id, held.token, {"ok": True}, schema=schema)
        figures = c.execute(
            query("attempt_account", schema),
            {
                "worker": worker,
                "ids": [held.id],
                "tokens": [held.token],
                "wall": [1.0],
                "cpu_user": [0.5],
                "cpu_system": [0.1],
                "peak_memory": [1000],
            },
        ).fetchall()
        assert figures == [(job,)]
    assert Db.prepare(conn, schema).job(job)["status"] == "completed"


def test_the_daemon_cannot_change_what_a_job_runs(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It cannot change a job's payload, handler, queue, priority, dedupe key or who
    enqueued it, nor insert a job (other than the follow-ups of a job it holds, below) or
    delete one."""
    client.enqueue(conn, "h", schema=schema)
    with as_role(roles, schema, "daemon") as c:
        assert (
            runnable(
                c,
                schema,
                [
                    "UPDATE @schema@.jobs SET payload = '{\"evil\": 1}'",
                    "UPDATE @schema@.jobs SET handler = 'other'",
                    "UPDATE @schema@.jobs SET queue = 'other'",
                    "UPDATE @schema@.jobs SET priority = -32768",
                    "UPDATE @schema@.jobs SET dedupe_key = 'x'",
                    "UPDATE @schema@.jobs SET enqueued_by = 'someone'",
                    "INSERT INTO @schema@.jobs (handler) VALUES ('h')",
                    "DELETE FROM @schema@.jobs",
                    "SELECT @schema@.enqueue('h')",
                    'SELECT @schema@.enqueue_many(\'[{"handler": "h"}]\')',
                ],
            )
            == []
        )


def other_hosts_attempt(conn: psycopg.Connection, schema: str) -> lease.ClaimedJob:
    """A job running on another host (claimed by the owner, as that host's daemon)."""
    client.enqueue(conn, "h", schema=schema)
    [held] = leasing.claim(
        conn,
        "other-host:1:abc",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(600, 1)},
        limit=1,
        schema=schema,
    )
    return held


def test_the_daemon_reads_no_lease_token(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It reads no lease token (a column grant leaves them out of jobs and job_logs), and
    tokens are drawn at random (60 bits), so it cannot end or renew another host's running
    attempt, by reading or by guessing."""
    held = other_hosts_attempt(conn, schema)
    assert held.token >= 1 << 60  # drawn, not counted
    with as_role(roles, schema, "daemon") as c:
        assert (
            runnable(
                c,
                schema,
                [
                    "SELECT lease_token FROM @schema@.jobs",
                    "SELECT * FROM @schema@.jobs",
                    "SELECT j FROM @schema@.jobs j",
                    "SELECT 1 FROM @schema@.jobs WHERE lease_token > 0",
                    "SELECT lease_token FROM @schema@.job_logs",
                ],
            )
            == []
        )
        # what it reads of the attempt: who holds it, not the token
        [(holder,)] = c.execute(
            render("SELECT locked_by FROM @schema@.jobs WHERE id = %s", schema), [held.id]
        ).fetchall()
        assert holder == "other-host:1:abc"
        # guessing: the counter tokens of earlier releases, then 20,000 in one batch
        for token in range(0, 50):
            assert not leasing.complete(c, holder, held.id, token, {"forged": 1}, schema=schema)
        guesses = [lease.Lease(held.id, t, 60) for t in range(1, 20_001)]
        assert not any(r.renewed for r in lease.renew(c, holder, guesses, schema=schema))
        # the lease check a refused outcome makes tells whether a token holds, not which
        assert lease.lease_state(c, held.id, 1, schema=schema) == lease.LeaseState(
            "running", None, holder
        )
    row = Db.prepare(conn, schema).job(held.id)
    assert (row["status"], row["locked_by"], row["lease_token"]) == (
        "running",
        holder,
        held.token,
    )
    # the holder still finishes it with its token
    assert leasing.complete(conn, holder, held.id, held.token, {"ok": 1}, schema=schema)


def test_the_daemon_fires_schedules_only_at_their_ticks(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It fires a declared schedule only at a tick the stored schedule produces, due within
    a minute, not older than the schedule's catch-up, each once, under the id of a live
    daemon."""
    from datetime import UTC, datetime, timedelta

    conn.execute(
        render(
            'SELECT @schema@.schedule_declare(\'s\', \'{"handler": "h", "every": 60,'
            ' "overlap": "allow"}\', \'op\')',
            schema,
        )
    )
    minute = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()) // 60 * 60, UTC)
    with as_role(roles, schema, "daemon") as c:
        fire = render("SELECT * FROM @schema@.schedule_fire_v2('s', %s, %s)", schema)

        def refusal(tick: datetime, worker: str = "w:1:a") -> str:
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                c.execute(fire, [tick, worker])
            return str(caught.value)

        # no live daemon of that id yet
        assert "is no live daemon" in refusal(minute)
        c.execute(
            query("worker_register", schema),
            {
                "id": "w:1:a",
                "secret": "s" * 32,
                "host": "h",
                "pid": 1,
                "version": "0",
                "queues": ["default"],
                "handlers": ["h"],
                "slots": 1,
                "state": "running",
                "settings": "{}",
                "heartbeat_interval": 10.0,
            },
        )
        assert "is no tick of it" in refusal(minute + timedelta(seconds=1))
        assert "is no tick of it" in refusal(minute + timedelta(microseconds=5))
        assert "in the future" in refusal(minute + timedelta(hours=1))
        # the audit's attack: 51 ticks of an `allow` schedule, fired at once
        fired = []
        for n in range(51):
            try:
                with c.transaction():
                    row = c.execute(fire, [minute - timedelta(minutes=n), "w:1:a"]).fetchone()
                    assert row is not None
                    fired.append(row[0])
            except psycopg.errors.InvalidParameterValue as exc:
                assert "is past" in str(exc)
        assert fired.count("fired") <= 2  # the due tick, and one within the skew
        assert c.execute(fire, [minute, "w:1:a"]).fetchone()[0] == "taken"  # each once
    jobs = conn.execute(
        render("SELECT count(*) FROM @schema@.jobs WHERE handler = 'h'", schema)
    ).fetchone()
    assert jobs is not None and jobs[0] == fired.count("fired")


def test_the_daemon_writes_its_own_registry_row_only(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It writes the registry row of its own daemon only (through functions that check
    the row's secret, with the server's clock), and a login keeps at most `registry_cap`
    daemons registered (100 until an operator changes it)."""
    from pgworkerd.queue import registry

    def info(worker: str) -> registry.WorkerInfo:
        return registry.WorkerInfo(worker, "h", 1, "t", ["default"], ["h"], 1)

    mine, theirs = "s" * 32, "t" * 32
    conn.execute(render("UPDATE @schema@.registry_cap SET max_live_per_login = 3", schema))
    with as_role(roles, schema, "daemon") as c:
        registry.register(c, info("a:1:x"), "running", schema, secret=mine)
        # another secret neither beats for the row nor takes its id over
        assert registry.heartbeat(c, info("a:1:x"), "running", [], schema, secret=theirs) is None
        with refused(conn, schema, match="another secret"):
            registry.register(c, info("a:1:x"), "running", schema, secret=theirs)
        registry.deregister(c, "a:1:x", schema, secret=theirs)
        assert registry.heartbeat(c, info("a:1:x"), "running", [], schema, secret=mine)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="32 to 256"):
            registry.register(c, info("b:1:x"), "running", schema, secret="short")
        # the cap: 3 rows not gone per login
        registry.register(c, info("b:1:x"), "running", schema, secret=mine)
        registry.register(c, info("c:1:x"), "running", schema, secret=mine)
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="registry_cap"):
            registry.register(c, info("d:1:x"), "running", schema, secret=mine)
        registry.deregister(c, "c:1:x", schema, secret=mine)
        registry.register(c, info("d:1:x"), "running", schema, secret=mine)
        # the server's clock: no heartbeat in the future, no one marked stale early
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="60 to 86400"):
            registry.mark_stale(c, 0, schema)
        assert (
            runnable(
                c,
                schema,
                [
                    "UPDATE @schema@.workers SET heartbeat_at = now() + interval '1 day'",
                    "INSERT INTO @schema@.workers (id, host, pid, version, slots)"
                    " VALUES ('x', 'h', 1, '0', 1)",
                    "DELETE FROM @schema@.workers",
                    "UPDATE @schema@.registry_cap SET max_live_per_login = 100000",
                ],
            )
            == []
        )
    rows = conn.execute(
        render(
            "SELECT id, state, registered_by, heartbeat_at <= now() FROM @schema@.workers"
            " ORDER BY id",
            schema,
        )
    ).fetchall()
    daemon = f"{schema}_daemon"
    assert rows == [
        ("a:1:x", "running", daemon, True),
        ("b:1:x", "running", daemon, True),
        ("c:1:x", "gone", daemon, True),
        ("d:1:x", "running", daemon, True),
    ]


def test_the_daemon_can_still_act_as_any_live_daemon_within_the_cap(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """Not protected: it reads every daemon's id and every running job's holder, and can
    fire a due tick under another live daemon's id; it can register up to the cap of fake
    daemons and keep them fresh, which count as peers (poll stretch, ring) like real ones;
    a cron field with L, W or # is not checked tick by tick, and both instants of a wall
    time repeated when the clocks go back pass."""
    from datetime import UTC, datetime

    from pgworkerd.queue import registry

    registry.register(
        conn,
        registry.WorkerInfo("real:1:x", "h", 1, "t", ["default"], ["h"], 1),
        "running",
        schema,
        secret="r" * 32,
    )
    conn.execute(
        render(
            'SELECT @schema@.schedule_declare(\'s\', \'{"handler": "h", "every": 1}\','
            " 'op'), @schema@.schedule_declare('last', '{\"handler\": \"h\","
            ' "cron": "0 0 L * *"}\', \'op\')',
            schema,
        )
    )
    now = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()), UTC)
    with as_role(roles, schema, "daemon") as c:
        [(ids,)] = c.execute(render("SELECT array_agg(id) FROM @schema@.workers", schema))
        assert ids == ["real:1:x"]
        fired = c.execute(
            render("SELECT outcome FROM @schema@.schedule_fire_v2('s', %s, 'real:1:x')", schema),
            [now],
        ).fetchone()
        assert fired == ("fired",)
        for n in range(5):
            registry.register(
                c,
                registry.WorkerInfo(f"fake:{n}:x", "h", n, "t", ["default"], ["h"], 64),
                "running",
                schema,
                secret="f" * 32,
            )
        peers = registry.peers(c, 60.0, schema)
        assert len(peers) == 6
        # "L" (the month's last day) is not checked: any day at midnight passes that field
        matches = c.execute(
            render("SELECT @schema@.cron_matches('0 0 L * *', 'UTC', %s)", schema),
            [datetime(2026, 11, 3, tzinfo=UTC)],
        ).fetchone()
        assert matches == (True,)


# -- pgworkerd_operator ----------------------------------------------------------------------

OPERATOR_CAN = [
    "SELECT * FROM @schema@.jobs",
    "SELECT * FROM @schema@.attempts",
    "SELECT * FROM @schema@.job_logs",
    "SELECT * FROM @schema@.workers",
    "SELECT * FROM @schema@.enqueue_bounds",
    "SELECT @schema@.enqueue('h')",
    'SELECT @schema@.enqueue_many_v2(\'[{"handler": "h", "concurrency_key": "k"}]\')',
    "UPDATE @schema@.jobs SET status = 'cancelled', finished_at = now(), updated_at = now()",
    "UPDATE @schema@.jobs SET status = 'pending', attempts = 0, snoozes = 0, run_at = now()",
    "SELECT @schema@.pause_queue('q')",
    "SELECT @schema@.resume_queue('q')",
    "SELECT @schema@.drain_request(NULL, NULL, false, NULL, NULL, NULL)",
    "SELECT @schema@.drain_lift(NULL, NULL)",
    "DELETE FROM @schema@.jobs WHERE status = 'completed'",
    "DELETE FROM @schema@.workers WHERE state = 'gone'",
    "SELECT @schema@.schedule_runs_prune('1 day')",
    "INSERT INTO @schema@.enqueue_bounds (queue, priority_min) VALUES ('q', 0)",
    "SELECT @schema@.schedule_declare('s', '{}', 'w')",
    "SELECT @schema@.retention_floor_set(86400)",
    "UPDATE @schema@.registry_cap SET max_live_per_login = 50",
]


def test_the_operator_acts_on_jobs_and_sets_bounds(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It reads what the reader reads, enqueues like the enqueuer, cancels, retries, pauses
    and resumes, drains and resumes daemons, prunes, declares schedules, sets the retention
    floor, enqueue bounds and the registry cap."""
    client.enqueue(conn, "h", schema=schema)
    with as_role(roles, schema, "operator") as c:
        assert [s for s in OPERATOR_CAN if not may_run(c, schema, s)] == []


def test_the_operator_cannot_change_what_a_job_runs(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It cannot change what a job runs (payload, handler, queue, checkpoint, dedupe key),
    its priority other than through `job_priority_set` (below), who enqueued it or its
    lease, nor claim, fire schedules, or write job logs or attempt history."""
    client.enqueue(conn, "h", schema=schema)
    with as_role(roles, schema, "operator") as c:
        assert (
            runnable(
                c,
                schema,
                [
                    "UPDATE @schema@.jobs SET payload = '{}'",
                    "UPDATE @schema@.jobs SET handler = 'x'",
                    "UPDATE @schema@.jobs SET queue = 'x'",
                    "UPDATE @schema@.jobs SET priority = -32768",
                    "UPDATE @schema@.jobs SET checkpoint = '{}'",
                    "UPDATE @schema@.jobs SET dedupe_key = 'x'",
                    "UPDATE @schema@.jobs SET enqueued_by = 'x'",
                    "UPDATE @schema@.jobs SET lease_token = lease_token + 1",
                    "UPDATE @schema@.jobs SET locked_by = 'x', locked_until = now()",
                    "SELECT * FROM @schema@.claim_jobs('w', '{default}', '{h}', '{60}', '{1}', 1,"
                    " NULL, NULL, NULL, NULL)",
                    "SELECT * FROM @schema@.schedule_fire_v2('s', now(), 'w')",
                    "INSERT INTO @schema@.job_logs (job_id, lease_token, attempt, worker)"
                    " VALUES (1, 1, 1, 'w')",
                    "INSERT INTO @schema@.attempts (job_id, lease_token, attempt, outcome)"
                    " VALUES (1, 1, 1, 'completed')",
                    "UPDATE @schema@.attempts SET error = 'x'",
                ],
            )
            == []
        )


def test_the_operator_can_delete_a_running_job(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """Not protected: its DELETE reaches any job, a running one included (prune is a table
    right)."""
    job = client.enqueue(conn, "h", schema=schema)
    [held] = claim_all(conn, schema)
    assert held.id == job
    with as_role(roles, schema, "operator") as c:
        gone = c.execute(render("DELETE FROM @schema@.jobs WHERE id = %s", schema), [job])
        assert gone.rowcount == 1


# -- pgworkerd_reader ------------------------------------------------------------------------


def test_the_reader_reads_everything_and_changes_nothing(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It reads every job's payload, result, error and logs, the registry, pauses,
    schedules, enqueue bounds and the registry cap, and changes nothing."""
    job = client.enqueue(conn, "h", {"card": "4111"}, schema=schema)
    with as_role(roles, schema, "reader") as c:
        payload = c.execute(
            render("SELECT payload FROM @schema@.jobs WHERE id = %s", schema), [job]
        )
        assert payload.fetchone() == ({"card": "4111"},)
        for table in (
            "attempts",
            "job_logs",
            "workers",
            "paused",
            "schedules",
            "enqueue_bounds",
            "registry_cap",
        ):
            assert may_run(c, schema, f"SELECT * FROM @schema@.{table}")
        assert (
            runnable(
                c,
                schema,
                [
                    "UPDATE @schema@.jobs SET status = 'cancelled'",
                    "DELETE FROM @schema@.jobs",
                    "SELECT @schema@.enqueue('h')",
                    "SELECT @schema@.pause_queue('q')",
                    "SELECT @schema@.drain_request(NULL, NULL, false, NULL, NULL, NULL)",
                    "DELETE FROM @schema@.workers",
                    "INSERT INTO @schema@.enqueue_bounds (queue) VALUES ('q')",
                    "SELECT @schema@.schedule_runs_prune('1 day')",
                    "UPDATE @schema@.registry_cap SET max_live_per_login = 1",
                ],
            )
            == []
        )


# -- the schema's owner ----------------------------------------------------------------------


def test_the_owner_can_do_anything_and_skips_the_enqueue_checks(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It can do anything in the schema: a job it inserts directly skips every check and
    bound of the enqueue functions, and only the claim's guard (above) stands between that
    row and a daemon."""
    with as_role(roles, schema, "operator") as op:
        op.execute(render("INSERT INTO @schema@.enqueue_bounds (priority_min) VALUES (0)", schema))
    with refused(conn, schema):  # the functions bind it too
        client.enqueue(conn, "h", priority=-1, schema=schema)
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {} (handler, priority, payload) VALUES"
            " ('h', -32768, %s::jsonb) RETURNING id"
        ).format(jobs_table(schema)),
        ['{"x": 1' + "0" * 5000 + "}"],  # a number Python refuses to load
    ).fetchone()
    assert row is not None
    assert claim_all(conn, schema) == []  # the guard: that job is dead, not handed out
    dead = conn.execute(
        sql.SQL("SELECT status::text, last_error FROM {} WHERE id = %s").format(jobs_table(schema)),
        [row[0]],
    ).fetchone()
    assert dead is not None and dead[0] == "dead" and "cannot run" in dead[1]


# -- a role with no grant at all -------------------------------------------------------------


@pytest.fixture
def stranger(pg: LocalPostgres, conn: psycopg.Connection, schema: str) -> Iterator[str]:
    """A login of the database with no grant at all; yields its DSN."""
    name = f"{schema}_stranger"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    pg.grant_login(name)
    yield pg.dsn("pgworkerd_test").replace("user=postgres", f"user={name}")
    drop_roles(conn, [name])


def test_a_role_with_no_grant_can_use_nothing_in_the_schema(
    schema: str, conn: psycopg.Connection, stranger: str
) -> None:
    """It can call and read nothing in the schema."""
    client.enqueue(conn, "h", schema=schema)
    with connect(stranger) as c:
        assert (
            runnable(
                c,
                schema,
                [
                    "SELECT @schema@.enqueue('h')",
                    "SELECT * FROM @schema@.job_get_v1(1)",
                    "SELECT * FROM @schema@.jobs",
                    "SELECT * FROM @schema@.schema_version",
                    "SELECT * FROM @schema@.enqueue_bounds",
                ],
            )
            == []
        )


def notifications(c: psycopg.Connection, count: int) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    for note in c.notifies(timeout=DEADLINE, stop_after=count):
        got.append((note.channel, note.payload))
    return got


def test_a_role_with_no_grant_listens_and_notifies(
    schema: str, conn: psycopg.Connection, stranger: str
) -> None:
    """It can LISTEN to the schema's channels (the queues that got jobs, finished jobs'
    ids, daemon ids, queue and handler names) and NOTIFY on them, which daemons take as
    hints only (above)."""
    channels = [f"{schema}.jobs", f"{schema}.finished", f"{schema}.wake"]
    with connect(stranger) as c:
        for channel in channels:
            c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        job = client.enqueue(conn, "h", queue="payroll", schema=schema)
        [held] = leasing.claim(
            conn,
            "w",
            queues=["payroll"],
            handlers={"h": lease.HandlerCapacity(60, 1)},
            limit=1,
            schema=schema,
        )
        assert leasing.complete(conn, "w", held.id, held.token, None, schema=schema)
        got = notifications(c, 3)
        assert (f"{schema}.jobs", "payroll") in got and (f"{schema}.finished", str(job)) in got
        c.execute(
            "SELECT pg_notify(%s, %s)",
            [f"{schema}.wake", '{"peer": "up", "id": "fake:1:x", "slots": 1000000}'],
        )


def test_a_role_with_no_grant_reads_the_definitions(
    schema: str, conn: psycopg.Connection, stranger: str
) -> None:
    """It can read the source of every pgworkerd function and the definition of every table
    in the catalogs, as on any PostgreSQL."""
    with connect(stranger) as c:
        source = c.execute(
            "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %s AND p.proname = 'enqueue_bounds_check'",
            [schema],
        ).fetchone()
        assert source is not None and "session_user" in source[0]
        columns = c.execute(
            "SELECT a.attname FROM pg_attribute a JOIN pg_class t ON t.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE n.nspname = %s AND t.relname = 'jobs' AND a.attnum > 0",
            [schema],
        ).fetchall()
        assert ("payload",) in columns


# -- the dashboard's loopback and a job's own code ------------------------------------------


def test_a_no_login_dashboard_serves_every_account_on_the_host(
    test_db_dsn: str, schema: str
) -> None:
    """Without users in the config the dashboard does not start, unless `--no-login` says
    so, and then it says at start that everyone who can reach the address acts with its
    database role: on loopback, every account and every job on the host."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another account")
    proc = subprocess.Popen(
        [
            str(PGWORKERD),
            *("--dsn", test_db_dsn, "--schema", schema),
            *("web", "--port", "0", "--no-login"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        warning = proc.stderr.readline()
        assert "WITHOUT A LOGIN" in warning, warning
        served = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stderr.readline())
        assert served is not None
        fetch = (
            "import urllib.request, sys;"
            f"r = urllib.request.urlopen('http://127.0.0.1:{served[1]}/', timeout=20);"
            "sys.stdout.write(str(r.status) + ' ' + r.read().decode())"
        )

        def as_nobody() -> str | None:
            done = subprocess.run(
                ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", fetch],
                capture_output=True,
                text=True,
                timeout=DEADLINE,
                cwd="/",
            )
            return done.stdout if done.returncode == 0 else None

        page = wait_for(as_nobody, what="the dashboard's overview, fetched as nobody")
        assert page.startswith("200 ") and 'id="daemons"' in page
    finally:
        proc.kill()
        proc.wait()


def test_a_job_runs_as_the_daemons_user_and_reaches_it(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    """It runs as the daemon's user, so it can read the daemon's config, signal the daemon
    and the other jobs of that user, and reach their `/proc` entries (the daemon, the fork
    server and the watchers are not dumpable: a job without CAP_SYS_PTRACE cannot open
    their descriptors): handlers run by one daemon are one trust domain."""
    # The tests run as root, so the job here has CAP_SYS_PTRACE and still reads the daemon's
    # environ; test_job_cgroups' daemon-log tests hold the descriptors a job without it
    # cannot open.
    config = daemons.config({"neighbours": {"target": "trusthandlers:neighbours"}})
    config.chmod(0o600)
    daemon = daemons.start(config)
    job = db.enqueue("neighbours", {"daemon_pid": daemon.pid, "config": str(config)})
    seen = db.wait_status(job, "completed")["result"]
    daemon_uid = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{daemon.pid}/status").read_text().splitlines()
            if line.startswith("Uid:")
        )
    )
    assert seen["uid"] == seen["euid"] == daemon_uid
    assert seen["signal_daemon"] is True  # kill(pid, 0): it may send any signal
    assert seen["config"] == config.read_text()
    assert seen["daemon_environ"] is True


# -- durable waits (schema 28) --------------------------------------------------------------


def test_the_enqueuer_signals_its_own_jobs_only(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It signals the jobs its own login enqueued, by id or by the correlation key their wait
    holds, and gets the answer of an unknown job for any other job; a finished job takes no
    signal, and the first signal of a name wins. A signal by a key no job of its own login
    holds is parked under that key (bounded, 7 days) and reaches only a job of its own
    login that later waits with the key, never another login's job holding or taking it."""
    other = client.enqueue(conn, "h", schema=schema)
    later = client.enqueue(conn, "h", schema=schema)
    held, taking = sorted(claim_all(conn, schema), key=lambda j: j.id)
    lease.suspend(conn, "w", held.id, held.token, "go", 60.0, key="theirs", schema=schema)
    with as_role(roles, schema, "enqueuer") as c:
        own = client.enqueue(c, "h", schema=schema)
        sent = pgworkerd.signal(c, own, "go", {"n": 1}, schema=schema)
        assert sent.outcome == "kept"
        assert pgworkerd.signal(c, own, "go", {"n": 2}, schema=schema).outcome == "ignored"
        for target in (other, other + 1000):
            with pytest.raises(pgworkerd.SignalRefused, match="this login may read"):
                pgworkerd.signal(c, target, "go", schema=schema)
        # by key: parked (the same answer whether another login's job holds the key or none)
        for key in ("theirs", "taken-later"):
            sent = pgworkerd.signal(c, None, "go", {"forged": True}, key=key, schema=schema)
            assert (sent.job_id, sent.outcome) == (None, "parked")
    assert db_status(conn, schema, other) == "suspended"
    # another login's job that takes the key afterwards does not receive it either
    lease.suspend(conn, "w", taking.id, taking.token, "go", 60.0, key="taken-later", schema=schema)
    assert db_status(conn, schema, later) == "suspended"
    conn.execute(
        render(
            "UPDATE @schema@.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            schema,
        ),
        (own,),
    )
    with (
        as_role(roles, schema, "enqueuer") as c,
        pytest.raises(pgworkerd.SignalRefused, match="a finished job takes no signal"),
    ):
        pgworkerd.signal(c, own, "later", schema=schema)


def db_status(conn: psycopg.Connection, schema: str, job_id: int) -> str:
    [(status,)] = conn.execute(
        render("SELECT status::text FROM @schema@.jobs WHERE id = %s", schema), (job_id,)
    ).fetchall()
    return str(status)


def test_the_daemon_suspends_held_jobs_only_and_cannot_forge_a_signal(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It suspends a job only while it holds its lease (the fenced `job_suspend`) and makes
    only suspended jobs past their timeout pending (`job_waits_expire`); it reads the
    signals its jobs received but cannot send or forge one: no EXECUTE on `signal_send`,
    no write on `signals`."""
    job_id = client.enqueue(conn, "h", schema=schema)
    with as_role(roles, schema, "daemon") as c:
        [held] = claim_all(c, schema)
        # another worker's name or a wrong token: nothing
        assert lease.suspend(c, "other", held.id, held.token, "go", 60.0, schema=schema) is None
        assert lease.suspend(c, "w", held.id, held.token + 1, "go", 60.0, schema=schema) is None
        done = lease.suspend(c, "w", held.id, held.token, "go", 60.0, schema=schema)
        assert done is not None and done.status == "suspended"
        assert lease.waits_expire(c, schema=schema) == 0  # not past its timeout
        assert may_run(c, schema, "SELECT * FROM @schema@.signals")
        assert (
            runnable(
                c,
                schema,
                [
                    f"SELECT * FROM @schema@.signal_send({job_id}, 'go', '1')",
                    "SELECT * FROM @schema@.signal_send_by_key('k', 'go', '1')",
                    "SELECT * FROM @schema@.signal_send_by_key_v2('k', 'go', '1')",
                    "SELECT * FROM @schema@.parked_signals",
                    "DELETE FROM @schema@.parked_signals",
                    f"INSERT INTO @schema@.signals (job_id, name) VALUES ({job_id}, 'go')",
                    "UPDATE @schema@.signals SET payload = '2'",
                    "DELETE FROM @schema@.signals",
                    f"UPDATE @schema@.jobs SET status = 'pending' WHERE id = {job_id}",
                    f"UPDATE @schema@.jobs SET wait_until = now() WHERE id = {job_id}",
                ],
            )
            == []
        )
    assert db_status(conn, schema, job_id) == "suspended"


def test_the_daemon_ends_only_jobs_past_their_deadline(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It ends only jobs past their `expires_at` (`job_expired_cancel`): pending ones, and
    running ones whose lease ran out, as cancelled with "expired: ..." in `last_error`,
    whatever their handler; a job before its deadline, or without one, is left as it is."""
    later = client.enqueue(conn, "nobody", expire_in=3600, schema=schema)
    never = client.enqueue(conn, "nobody", schema=schema)
    due = client.enqueue(conn, "nobody", expire_in=3600, schema=schema)
    conn.execute(
        render("UPDATE @schema@.jobs SET expires_at = now() - interval '1s' WHERE id = %s", schema),
        (due,),
    )
    with as_role(roles, schema, "daemon") as c:
        [(ended,)] = c.execute(render("SELECT @schema@.job_expired_cancel(100)", schema)).fetchall()
        assert ended == 1
        assert (
            runnable(c, schema, [f"UPDATE @schema@.jobs SET expires_at = now() WHERE id = {later}"])
            == []
        )
    assert [db_status(conn, schema, j) for j in (later, never, due)] == [
        "pending",
        "pending",
        "cancelled",
    ]


def test_the_daemon_writes_the_charts_rollup_only_by_counting(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It writes the charts' rollup (`attempt_rollups`, schema 38) only through
    `attempt_rollups_advance`, which counts the attempts as they are: no INSERT, UPDATE or
    DELETE on the rollup or its cursor, so it cannot forge a chart. The reader reads both."""
    conn.execute(
        render(
            "UPDATE @schema@.attempt_rollup_cursor SET rolled_to = now() - interval '1h'", schema
        )
    )
    with as_role(roles, schema, "daemon") as c:
        [(rolled_to, behind)] = c.execute(
            render("SELECT * FROM @schema@.attempt_rollups_advance(1000, 0)", schema)
        ).fetchall()
        assert rolled_to is not None and behind is False
        forged = (
            "INSERT INTO @schema@.attempt_rollups VALUES (60, now(), 'h', 1000, 0, '{}', '{}')",
            "UPDATE @schema@.attempt_rollups SET completed = 1000",
            "DELETE FROM @schema@.attempt_rollups",
            "UPDATE @schema@.attempt_rollup_cursor SET rolled_to = now() - interval '30 days'",
        )
        assert runnable(c, schema, forged) == []
    with as_role(roles, schema, "reader") as c:
        c.execute(render("SELECT * FROM @schema@.attempt_rollups", schema)).fetchall()
        c.execute(render("SELECT * FROM @schema@.attempt_rollup_cursor", schema)).fetchall()
        assert (
            runnable(
                c,
                schema,
                [
                    "SELECT * FROM @schema@.attempt_rollups_advance(1000, 0)",
                ],
            )
            == []
        )


def test_the_operator_signals_any_job(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It signals any job (it reads them all), as the enqueuer signals its own."""
    job_id = client.enqueue(conn, "h", schema=schema)
    [held] = claim_all(conn, schema)
    lease.suspend(conn, "w", held.id, held.token, "go", 60.0, key="k-1", schema=schema)
    with as_role(roles, schema, "operator") as c:
        sent = pgworkerd.signal(c, None, "go", "approved", key="k-1", schema=schema)
        assert (sent.job_id, sent.outcome) == (job_id, "resumed")
    assert db_status(conn, schema, job_id) == "pending"

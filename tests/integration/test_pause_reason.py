"""A pause carries a reason and names the person who asked (issue 27; schema 38:
paused.requested_by, paused_add), not only the database role every operator shares: from
the CLI (`pause --reason --by`, else the OS user) and through the SQL function, with the
reason and the name bounded (length, NUL and other control characters refused, nothing
changed)."""

from __future__ import annotations

import getpass
import json

import psycopg
import pytest
from daemon_harness import Daemons, Db

from pgworkerd.queue import fleet, views


def test_the_cli_pause_records_its_reason_and_who_asked(daemons: Daemons, db: Db) -> None:
    paused = daemons.cli("pause", "--queue", "mail", "--reason", "smtp relay down", "--by", "bob")
    assert (paused.returncode, paused.stdout) == (0, "paused queue 'mail'\n"), paused.stderr
    mine = daemons.cli("pause", "--handler", "export")  # no --by: the OS user
    assert mine.returncode == 0, mine.stderr
    rows = {r["name"]: r for r in views.paused(db.conn, db.schema)}
    assert (rows["mail"]["comment"], rows["mail"]["requested_by"]) == ("smtp relay down", "bob")
    assert rows["mail"]["paused_by"] == db.conn.info.user  # the role, kept beside
    assert (rows["export"]["comment"], rows["export"]["requested_by"]) == (
        None,
        getpass.getuser(),
    )
    status = daemons.cli("status").stdout
    assert f"by bob (role {db.conn.info.user}): smtp relay down" in status
    shown = json.loads(daemons.cli("status", "--json").stdout)
    assert {p["name"]: p["requested_by"] for p in shown["paused"]} == {
        "mail": "bob",
        "export": getpass.getuser(),
    }
    # the first pause stands: a second one changes neither reason nor person
    again = daemons.cli("pause", "--queue", "mail", "--reason", "other", "--by", "carol")
    assert again.stdout == "queue 'mail' was already paused\n"
    assert views.paused(db.conn, db.schema)[0]["requested_by"] == "bob"
    # --comment still works (the old name of --reason)
    old = daemons.cli("pause", "--queue", "reports", "--comment", "month-end")
    assert old.returncode == 0, old.stderr
    assert {p["name"]: p["comment"] for p in views.paused(db.conn, db.schema)}["reports"] == (
        "month-end"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reason", "x" * 501], "--reason must be at most 500 characters, not 501"),
        (["--reason", "disk\x00full"], "--reason contains a NUL character"),
        (["--reason", "two\nlines"], "--reason must be one line without control characters"),
        (["--reason", "\x1b[2Jcleared"], "--reason must be one line without control"),
        (["--by", ""], "--by must not be empty"),
        (["--by", "b" * 129], "--by must be at most 128 characters, not 129"),
        (["--by", "bob\x00"], "--by contains a NUL character"),
    ],
)
def test_a_bad_reason_or_name_is_refused_and_nothing_is_paused(
    daemons: Daemons, db: Db, args: list[str], says: str
) -> None:
    refused = daemons.cli("pause", "--queue", "mail", *args)
    assert refused.returncode == 3, refused.stdout
    assert says in refused.stderr
    assert views.paused(db.conn, db.schema) == []


@pytest.mark.parametrize(
    ("reason", "by", "says"),
    [
        ("x" * 501, "bob", "the reason must be at most 500 characters, not 501"),
        ("a\tb", "bob", "the reason must be one line without control characters"),
        ("ok", None, "who asked \\(requested_by\\) must be a name"),
        ("ok", "", "who asked \\(requested_by\\) must be a name"),
        ("ok", "b" * 129, "who asked \\(requested_by\\) must be a name"),
        ("ok", "bob\x1b", "who asked \\(requested_by\\) must be a name"),
    ],
)
def test_paused_add_refuses_hostile_arguments_whoever_calls_it(
    db: Db, reason: str, by: str | None, says: str
) -> None:
    """The database checks too (22023): a caller that skips the Python checks gets the
    same refusal."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=says):
        db.rows("SELECT {schema}.paused_add('queue', 'mail', %s, %s)", (reason, by))
    assert views.paused(db.conn, db.schema) == []


def test_set_paused_checks_before_the_database(db: Db) -> None:
    with pytest.raises(ValueError, match="the reason contains a NUL character"):
        fleet.set_paused(
            db.conn, db.schema, "queue", "mail", pause=True, comment="a\x00b", requested_by="bob"
        )
    assert views.paused(db.conn, db.schema) == []


def test_explain_names_who_paused_and_why(daemons: Daemons, db: Db) -> None:
    job = db.enqueue("report", {}, queue="reports")
    daemons.cli("pause", "--queue", "reports", "--reason", "month-end freeze", "--by", "alice")
    text = daemons.cli("explain", str(job)).stdout
    assert f"by alice (role {db.conn.info.user}): month-end freeze" in text
    shown = json.loads(daemons.cli("explain", str(job), "--json").stdout)
    [reason] = [r for r in shown["reasons"] if r["code"] == "queue_paused"]
    facts = reason["facts"]
    assert (facts["requested_by"], facts["comment"]) == ("alice", "month-end freeze")

"""The column contract (issue 23): every record built from a statement's result is built
by column name (queue/records.py), and its fields are the statement's result columns, by
name and in order, as a real PostgreSQL describes the statement (PREPARE, then describe:
nothing runs). A renamed, dropped or reordered column fails here, not in production."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

import pgworkerd
from pgworkerd import batches, client, signals
from pgworkerd.queue import hotpath, lease, records
from pgworkerd.queue.queries import _raw

PACKAGE = Path(pgworkerd.__file__).parent

# The records the package builds from statements; a new one registers with
# @records.built_from and is then checked below as well.
EXPECTED = {
    "job_claim": lease.ClaimedJob,
    "job_renew": lease.RenewOutcome,
    "job_fail": lease.FailOutcome,
    "job_snooze": lease.SnoozeOutcome,
    "job_lease_state": lease.LeaseState,
    "job_next_run_at": lease.WakeupFacts,
    "job_info": client.JobInfo,
    "job_suspend": lease.SuspendOutcome,
    "signal_send": signals.SignalSent,
    "signal_send_by_key": signals.SignalSent,
    "job_complete_with_follow_ups": lease.FollowUpsOutcome,
    "batch_members_page": batches.MemberOutcome,
}


def test_the_registry_names_every_record_built_from_a_statement() -> None:
    assert records.REGISTRY == EXPECTED
    assert set(records.REGISTRY) <= set(_raw())  # each a statement of sql/queries/


def _result_columns(conn: psycopg.Connection, statement: str, schema: str) -> tuple[str, ...]:
    text, _ = hotpath._numbered(statement, schema)
    name = f"contract_{statement}".encode()
    conn.pgconn.prepare(name, text)
    try:
        described = conn.pgconn.describe_prepared(name)
        if described.status != psycopg.pq.ExecStatus.COMMAND_OK:
            raise AssertionError(described.error_message.decode())
        return tuple((described.fname(i) or b"").decode() for i in range(described.nfields))
    finally:
        conn.execute(f"DEALLOCATE {name.decode()}")


@pytest.mark.parametrize("statement", sorted(EXPECTED))
def test_a_records_fields_are_its_statements_columns(
    conn: psycopg.Connection, schema: str, statement: str
) -> None:
    columns = _result_columns(conn, statement, schema)
    assert columns == records.field_names(records.REGISTRY[statement])


def test_a_reordered_result_still_fills_each_field_by_name() -> None:
    columns = ("locked_by", "status", "token")
    state = records.build(lease.LeaseState, columns, ("w1", "running", 7))
    assert state == lease.LeaseState(status="running", token=7, locked_by="w1")


def test_a_missing_column_is_a_clear_error() -> None:
    with pytest.raises(LookupError, match=r"LeaseState needs the column\(s\) token"):
        records.build(lease.LeaseState, ("status", "lease_token", "locked_by"), ("x", 1, None))


# A record built from a row by position (Record(*row), row[3]) is what the contract
# replaces; only queue/records.py itself spreads a row into a record.
POSITIONAL = re.compile(r"\b[A-Z]\w*\(\*(row|rows\[\d+\]|r)\b|\braw\[\d+\]|\brow\[\d+:")


def test_no_record_is_built_by_position() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "records.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if POSITIONAL.search(line)
    ]
    assert found == []

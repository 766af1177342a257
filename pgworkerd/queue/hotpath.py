"""Running the queue statements with as little client work as psycopg allows.

A worker spends its life in a handful of statements (claim, complete, renew, fail), each a
round trip of ~0.1 ms on a local server. psycopg's cursor adds ~20 µs of Python
bookkeeping to each (query conversion, the prepared-statement cache, result selection):
on one connection the claim-and-complete loop reached 67 % of the raw SQL ceiling through
a cursor and 75-78 % this way (bench/queue_bench.py). This module
sends them through psycopg's own lower layers instead: libpq's protocol calls, psycopg's
wait loop (so signals, timeouts and cancels behave as with a cursor) and its Transformer
(so every value is dumped and loaded by the connection's adapters, as a cursor would).

Parameters travel as text with no declared type: the server takes each one's type from
the statement (every parameter of a queue statement has a cast or a typed context), so
one prepared statement serves every value. When the connection cannot take a statement
this way — closed, in pipeline mode, or idle outside autocommit, where psycopg would open
the caller's transaction first — the statement goes through an ordinary cursor.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import errors, generators, pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.rows import tuple_row

from pgworkerd.describe import short_error
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query

_PLACEHOLDER_RE = re.compile(r"%\((\w+)\)s|%%")
T = TypeVar("T")


@functools.cache
def _numbered(name: str, schema: str) -> tuple[bytes, tuple[str, ...]]:
    """Statement `name` with its %(param)s placeholders numbered $1.. in order of first
    appearance; returns the text and the parameter names in number order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] is None:
            return "%"  # %% is a literal percent sign
        if match[1] not in order:
            order.append(match[1])
        return f"${order.index(match[1]) + 1}"

    text = _PLACEHOLDER_RE.sub(number, query(name, schema))
    return text.encode(), tuple(order)


@functools.cache
def _statement_name(text: bytes) -> bytes:
    """The server-side name of a statement: derived from its text, so that a name can only
    ever stand for that text, whichever connection state or thread prepared it first."""
    return b"_pgworkerd_" + hashlib.sha1(text).hexdigest()[:16].encode()


class _ConnectionState:
    """What this module keeps per connection, like a cached cursor would: a Transformer
    (adapters as the connection had them at its first statement) and the statements
    prepared on the server."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.transformer = Transformer(conn)
        self.prepared: set[bytes] = set()
        self.cursors: dict[int, psycopg.Cursor[Any]] = {}  # thread id -> fallback cursor


_STATE_LOCK = threading.Lock()


def _state(conn: psycopg.Connection) -> _ConnectionState:
    try:
        return conn._pgworkerd_state  # type: ignore[attr-defined,no-any-return]
    except AttributeError:
        with _STATE_LOCK:  # two threads' first statements must not make two states
            state = getattr(conn, "_pgworkerd_state", None)
            if state is None:
                state = conn._pgworkerd_state = _ConnectionState(conn)  # type: ignore[attr-defined]
            return state


def _direct_ok(conn: psycopg.Connection) -> bool:
    """Whether a statement can go straight to libpq with the same effect as a cursor's."""
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK or pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return False
    status = pgconn.transaction_status
    if status == pq.TransactionStatus.INTRANS:
        return True  # inside the caller's transaction, as a cursor would be
    return status == pq.TransactionStatus.IDLE and conn.autocommit


def run(
    conn: psycopg.Connection,
    name: str,
    params: Mapping[str, Any],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> list[tuple[Any, ...]]:
    """Execute statement `name` of sql/queries.sql; returns its rows as tuples."""
    return _execute(conn, name, params, schema, _load_all)


@dataclass(frozen=True)
class UnloadableRow:
    """A row of which some value cannot be loaded (a number too long for Python, JSON
    nested too deep, a timestamp out of Python's range, ...): its values as the server
    sent them (text format, None for NULL) and why the first bad column failed."""

    raw: tuple[bytes | None, ...]
    reason: str


def run_guarded(
    conn: psycopg.Connection,
    name: str,
    params: Mapping[str, Any],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> list[tuple[Any, ...] | UnloadableRow]:
    """Like run, but a row that cannot be loaded comes back as an UnloadableRow instead
    of failing the whole result: the claim has committed by then, and one job's bad data
    must not cost the others of the same claim their start."""
    return _execute(conn, name, params, schema, _load_each)


def _load_all(tx: Transformer, result: pq.abc.PGresult) -> list[tuple[Any, ...]]:
    return tx.load_rows(0, result.ntuples, tuple)


def _load_each(tx: Transformer, result: pq.abc.PGresult) -> list[tuple[Any, ...] | UnloadableRow]:
    try:
        return list(tx.load_rows(0, result.ntuples, tuple))
    except Exception:  # any loader's error: find the rows at fault, load the others
        return [_load_row(tx, result, row) for row in range(result.ntuples)]


def _load_row(
    tx: Transformer, result: pq.abc.PGresult, row: int
) -> tuple[Any, ...] | UnloadableRow:
    try:
        return tuple(tx.load_row(row, tuple))
    except Exception:
        pass
    raw = tuple(result.get_value(row, col) for col in range(result.nfields))
    reason = "a value cannot be loaded"
    for col, value in enumerate(raw):
        if value is None:
            continue
        try:
            tx.get_loader(result.ftype(col), pq.Format(result.fformat(col))).load(value)
        except Exception as exc:
            name = (result.fname(col) or b"?").decode(errors="replace")
            reason = f"{name} cannot be loaded: {short_error(exc)}"
            break
    return UnloadableRow(raw, reason)


def _execute(
    conn: psycopg.Connection,
    name: str,
    params: Mapping[str, Any],
    schema: str,
    load: Callable[[Transformer, pq.abc.PGresult], list[T]],
) -> list[T]:
    state = _state(conn)
    with conn.lock:
        if _direct_ok(conn):
            text, order = _numbered(name, schema)
            tx = state.transformer
            values = tx.dump_sequence([params[p] for p in order], [PyFormat.TEXT] * len(order))
            if conn.prepare_threshold is None:  # no server-side statements (old PgBouncer)
                result = _send(conn, lambda: conn.pgconn.send_query_params(text, values))
            else:
                result = _run_prepared(conn, state, text, values)
            tx.set_pgresult(result)
            return load(tx, result)
    return _via_cursor(conn, state, name, params, schema, load)


def _run_prepared(
    conn: psycopg.Connection, state: _ConnectionState, text: bytes, values: Any
) -> pq.abc.PGresult:
    pgconn = conn.pgconn
    statement = _statement_name(text)
    if statement not in state.prepared:
        try:
            _send(conn, lambda: pgconn.send_prepare(statement, text))
        except errors.DuplicatePreparedStatement:
            # Prepared already (its reply was lost, or this state was cleared): the name
            # can only stand for this text. Inside a transaction the error aborted it.
            if pgconn.transaction_status != pq.TransactionStatus.IDLE:
                state.prepared.add(statement)
                raise
        state.prepared.add(statement)
    try:
        return _send(conn, lambda: pgconn.send_query_prepared(statement, values))
    except errors.InvalidSqlStatementName:
        # Someone ran DEALLOCATE (ALL) or DISCARD ALL on this session: forget what was
        # prepared, and prepare again unless the failed attempt aborted a transaction.
        state.prepared.clear()
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise
        return _run_prepared(conn, state, text, values)


def _send(conn: psycopg.Connection, send: Any) -> pq.abc.PGresult:
    """Send one command, wait for its result with psycopg's wait loop, raise its error."""
    try:
        send()
        results = conn.wait(generators.execute(conn.pgconn))
    except errors.Error as exc:  # psycopg's convention: no traceback into its internals
        raise exc.with_traceback(None) from None
    if not results:
        raise errors.InternalError("got no result from the query")
    result = results[-1]
    if result.status == pq.ExecStatus.FATAL_ERROR:
        raise errors.error_from_result(result, encoding=conn.info.encoding)
    return result


def _via_cursor(
    conn: psycopg.Connection,
    state: _ConnectionState,
    name: str,
    params: Mapping[str, Any],
    schema: str,
    load: Callable[[Transformer, pq.abc.PGresult], list[T]],
) -> list[T]:
    """The same statement through a cursor (which begins the caller's transaction, raises
    psycopg's errors for a closed or broken connection, and works in pipeline mode)."""
    ident = threading.get_ident()
    cur = state.cursors.get(ident)
    if cur is None or cur.closed:
        cur = state.cursors[ident] = conn.cursor(row_factory=tuple_row)
    cur.execute(query(name, schema), params)
    try:
        return cur.fetchall()  # type: ignore[return-value]
    except Exception:
        # A loader's error (psycopg's DataError for a timestamp out of range, json's
        # ValueError, ...) leaves the rows in the cursor's result; a server error does not.
        result = cur.pgresult
        if load is _load_all or result is None or result.status != pq.ExecStatus.TUPLES_OK:
            raise
    # A row that cannot be loaded: the result again, through the direct path's loader.
    tx = Transformer(conn)
    tx.set_pgresult(cur.pgresult)
    return load(tx, cur.pgresult)

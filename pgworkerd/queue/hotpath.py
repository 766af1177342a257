"""Running the daemon's queue statements with as little client work as psycopg allows.

Where it runs: only the daemon's statements of every loop turn come through here
(queue.lease: the claim, the completions written with it, the renewals; queue.attempts:
the usage figures); they run on the daemon's own connection. The application's enqueue
(pgworkerd.client) and the operators' statements (queue.admin) use psycopg's public API
only. That is the whole opt-in: no connection is marked, the statement decides.

Why: a worker spends its life in a handful of statements, each a round trip of ~0.1 ms on
a local server. psycopg's cursor adds ~20 µs of Python bookkeeping to each (query
conversion, the prepared-statement cache, result selection). This module sends them
through psycopg's own lower layers instead: libpq's protocol calls, psycopg's wait loop
(so signals, timeouts and cancels behave as with a cursor) and a Transformer made for each
statement, as a cursor makes one (so every value is dumped and loaded by the connection's
adapters, as they are now).

Those layers are psycopg internals (`Connection.lock`, `Connection.wait`,
`psycopg.generators.execute`, `errors.error_from_result`, Transformer methods). At import,
`probe()` checks that each exists with the shape used here. If one does not (a psycopg
release renamed it), or PGWORKERD_HOTPATH=off is set, every statement goes through a plain
cursor instead (the same rows, errors and transactions, a little more client CPU) and the
reason is logged once, at the first statement: importing pgworkerd never fails for it.
pyproject.toml pins psycopg to the versions CI runs this module against.

Parameters travel as text with no declared type: the server takes each one's type from
the statement (every parameter of a queue statement has a cast or a typed context), so
one prepared statement serves every value. When the connection cannot take a statement
this way (closed, in pipeline mode, or idle outside autocommit, where psycopg would open
the caller's transaction first) the statement goes through a cursor as well.

Statements that must commit together (run_together: a busy daemon's completions and its
next claim) go out in libpq's pipeline mode with one Sync: one implicit transaction, one
round trip, and one WAL flush for statements that ask for a durable commit, where each
alone would pay its own. Where a pipeline cannot be used they run one by one inside a
transaction: the same rows and the same all-or-nothing, more round trips.

What is kept per connection, as a cached cursor would keep it: a Transformer (dumpers and
loaders found once: ~10 µs per statement measured, a third of this module's gain) and the
names of the statements prepared on its server session. It hangs on the connection object
itself (attribute `_pgworkerd_hotpath`), which only ever is the daemon's own (or a test's
or benchmark's) since only the daemon's statement modules (queue.lease, queue.attempts)
and tests/support/leasing.py call here: a cache keyed weakly by connection could not
hold a Transformer, which refers to its connection, without keeping every connection
alive. The daemon registers no adapters after its first statement, so the
cached Transformer sees all of them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import errors, pq
from psycopg.adapt import PyFormat
from psycopg.rows import tuple_row

from pgworkerd.describe import short_error
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query

if TYPE_CHECKING:
    from psycopg.abc import Transformer as TransformerT

log = logging.getLogger("pgworkerd")

_PLACEHOLDER_RE = re.compile(r"%\((\w+)\)s|%%")
T = TypeVar("T")

# (module, attribute, what it must be) for every psycopg internal the direct path uses.
REQUIRED: tuple[tuple[str, str, str], ...] = (
    ("psycopg.generators", "execute", "callable"),
    ("psycopg.errors", "error_from_result", "callable"),
    ("psycopg.adapt", "Transformer", "callable"),
    ("psycopg.adapt.Transformer", "dump_sequence", "callable"),
    ("psycopg.adapt.Transformer", "set_pgresult", "callable"),
    ("psycopg.adapt.Transformer", "load_rows", "callable"),
    ("psycopg.adapt.Transformer", "load_row", "callable"),
    ("psycopg.adapt.Transformer", "get_loader", "callable"),
    ("psycopg.Connection", "wait", "wait(gen, ...)"),
    ("psycopg.pq.PGconn", "send_prepare", "callable"),
    ("psycopg.pq.PGconn", "send_query_prepared", "callable"),
    ("psycopg.pq.PGconn", "send_query_params", "callable"),
    ("psycopg.generators", "send", "callable"),
    ("psycopg.generators", "fetch_many", "callable"),
    ("psycopg.pq.PGconn", "enter_pipeline_mode", "callable"),
    ("psycopg.pq.PGconn", "exit_pipeline_mode", "callable"),
    ("psycopg.pq.PGconn", "pipeline_sync", "callable"),
)


def _resolve(dotted: str) -> Any:
    """The object a dotted name stands for: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module named {parts[0]!r}")


def probe(required: Sequence[tuple[str, str, str]] = REQUIRED) -> str | None:
    """Why the direct path cannot be used with the installed psycopg; None if it can."""
    setting = os.environ.get("PGWORKERD_HOTPATH", "").strip().lower()
    if setting in ("off", "0", "no", "false"):
        return f"PGWORKERD_HOTPATH={setting}"
    for owner, name, shape in required:
        try:
            value = getattr(_resolve(owner), name)
        except (ImportError, AttributeError):
            return f"psycopg {psycopg.__version__} has no {owner}.{name}"
        if not callable(value):
            return f"psycopg {psycopg.__version__}: {owner}.{name} is not callable"
        if shape.startswith("wait("):
            try:
                params = list(inspect.signature(value).parameters)
            except (TypeError, ValueError):
                params = []
            if params[:2] != ["self", "gen"]:
                return f"psycopg {psycopg.__version__}: {owner}.{name} takes {params}, not {shape}"
    return None


UNAVAILABLE = probe()
DIRECT = UNAVAILABLE is None  # tests set it to False to run the cursor path
if DIRECT:
    from psycopg import generators
    from psycopg.adapt import Transformer

_reported = threading.Event()


def _report_fallback(reason: str) -> None:
    """Say once, at the first statement (the daemon's logging is set up by then), why the
    cursor path runs."""
    if not _reported.is_set():
        _reported.set()
        log.warning("queue statements run through a plain cursor (%s)", reason)


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
    """What this module keeps per connection: a Transformer (adapters as the connection
    had them at its first statement) and the statements prepared on the server."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.transformer: TransformerT = Transformer(conn)
        self.prepared: set[bytes] = set()


_STATE_LOCK = threading.Lock()


def _state(conn: psycopg.Connection[Any]) -> _ConnectionState:
    try:
        return conn._pgworkerd_hotpath  # type: ignore[attr-defined]
    except AttributeError:
        with _STATE_LOCK:  # two threads' first statements must not make two states
            state = getattr(conn, "_pgworkerd_hotpath", None)
            if state is None:
                state = conn._pgworkerd_hotpath = _ConnectionState(conn)  # type: ignore[attr-defined]
            return state


@contextlib.contextmanager
def meanwhile(conn: psycopg.Connection[Any], serve: Callable[[int], None] | None) -> Iterator[None]:
    """While in the block, a pipeline (run_together) that has sent its statements calls
    `serve(fd)` before it waits for their results: the caller's other work (the daemon
    reads its children and hands them held jobs) until the socket `fd` is readable, the
    server's answer on its way. `serve` must not use the connection, nor raise.
    None: wait as always."""
    if serve is None:
        yield
        return
    conn._pgworkerd_meanwhile = serve  # type: ignore[attr-defined]
    try:
        yield
    finally:
        conn._pgworkerd_meanwhile = None  # type: ignore[attr-defined]


def _direct_ok(conn: psycopg.Connection[Any]) -> bool:
    """Whether a statement can go straight to libpq with the same effect as a cursor's."""
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK or pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return False
    status = pgconn.transaction_status
    if status == pq.TransactionStatus.INTRANS:
        return True  # inside the caller's transaction, as a cursor would be
    return status == pq.TransactionStatus.IDLE and conn.autocommit


class Rows(list[T]):
    """A statement's rows (tuples) and the names of its result columns, from which
    queue.records builds records by name."""

    def __init__(self, rows: Iterable[T], columns: tuple[str, ...]) -> None:
        super().__init__(rows)
        self.columns = columns


def run(
    conn: psycopg.Connection[Any],
    name: str,
    params: Mapping[str, Any],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> Rows[tuple[Any, ...]]:
    """Execute statement `name` (sql/queries/); returns its rows as tuples."""
    if DIRECT:
        rows = _execute(conn, name, params, schema, _load_all)
        if rows is not None:
            return rows
    else:
        _report_fallback(UNAVAILABLE or "disabled")
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query(name, schema), params)
        fetched = cur.fetchall()  # first: in pipeline mode the description comes with it
        return Rows(fetched, _described(cur))


def _described(cur: psycopg.Cursor[Any]) -> tuple[str, ...]:
    return tuple(c.name for c in cur.description or ())


@dataclass(frozen=True)
class UnloadableRow:
    """A row of which some value cannot be loaded (a number too long for Python, JSON
    nested too deep, a timestamp out of Python's range, ...): its values as the server
    sent them (text format, None for NULL) and why the first bad column failed."""

    raw: tuple[bytes | None, ...]
    reason: str


def run_guarded(
    conn: psycopg.Connection[Any],
    name: str,
    params: Mapping[str, Any],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> Rows[tuple[Any, ...] | UnloadableRow]:
    """Like run, but a row that cannot be loaded comes back as an UnloadableRow instead
    of failing the whole result: the claim has committed by then, and one job's bad data
    must not cost the others of the same claim their start."""
    if DIRECT:
        rows = _execute(conn, name, params, schema, _load_each)
        if rows is not None:
            return rows
    else:
        _report_fallback(UNAVAILABLE or "disabled")
    return _guarded_via_cursor(conn, name, params, schema)


@dataclass(frozen=True)
class Step:
    """One statement of run_together: `guarded` loads its rows as run_guarded does."""

    name: str
    params: Mapping[str, Any]
    guarded: bool = False


def run_together(
    conn: psycopg.Connection[Any], steps: Sequence[Step], *, schema: str = DEFAULT_SCHEMA
) -> list[Rows[Any]]:
    """Run statements in order in one transaction (all or none); returns each one's rows.

    On an idle autocommit connection they go out in one pipeline with one Sync: one round
    trip and one commit (so one WAL flush where a statement asks for a durable commit),
    where one statement at a time costs a round trip and a commit each. Elsewhere (inside
    the caller's transaction, no pipeline support, the cursor path) they run one by one,
    in a transaction of their own unless the caller's is open."""
    if DIRECT and psycopg.Pipeline.is_supported():
        rows = _execute_together(conn, steps, schema)
        if rows is not None:
            return rows
    elif not DIRECT:
        _report_fallback(UNAVAILABLE or "disabled")

    def one(step: Step) -> Rows[Any]:
        if step.guarded:
            return run_guarded(conn, step.name, step.params, schema=schema)
        return run(conn, step.name, step.params, schema=schema)

    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return [one(step) for step in steps]
    with conn.transaction():
        return [one(step) for step in steps]


# -- the direct path ----------------------------------------------------------------------


def _columns(result: pq.abc.PGresult) -> tuple[str, ...]:
    return tuple(_column_name(result, col) for col in range(result.nfields))


def _load_all(tx: TransformerT, result: pq.abc.PGresult) -> Rows[tuple[Any, ...]]:
    return Rows(tx.load_rows(0, result.ntuples, tuple), _columns(result))


def _load_each(tx: TransformerT, result: pq.abc.PGresult) -> Rows[tuple[Any, ...] | UnloadableRow]:
    try:
        rows: list[tuple[Any, ...] | UnloadableRow] = list(tx.load_rows(0, result.ntuples, tuple))
    except Exception:  # any loader's error: find the rows at fault, load the others
        rows = [_load_row(tx, result, row) for row in range(result.ntuples)]
    return Rows(rows, _columns(result))


def _load_row(
    tx: TransformerT, result: pq.abc.PGresult, row: int
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
            reason = f"{_column_name(result, col)} cannot be loaded: {short_error(exc)}"
            break
    return UnloadableRow(raw, reason)


def _column_name(result: pq.abc.PGresult, col: int) -> str:
    return (result.fname(col) or b"?").decode(errors="replace")


def _execute(
    conn: psycopg.Connection[Any],
    name: str,
    params: Mapping[str, Any],
    schema: str,
    load: Callable[[TransformerT, pq.abc.PGresult], Rows[T]],
) -> Rows[T] | None:
    """The statement below the cursor; None when the connection's state asks for a
    cursor instead (the caller runs it through one)."""
    state = _state(conn)
    with conn.lock:
        if not _direct_ok(conn):
            return None
        text, order = _numbered(name, schema)
        tx = state.transformer
        values = tx.dump_sequence([params[p] for p in order], [PyFormat.TEXT] * len(order))
        if conn.prepare_threshold is None:  # no server-side statements (old PgBouncer)
            result = _send(conn, lambda: conn.pgconn.send_query_params(text, values))
        else:
            result = _run_prepared(conn, state.prepared, text, values)
        tx.set_pgresult(result)
        return load(tx, result)


def _prepare(
    conn: psycopg.Connection[Any], prepared: set[bytes], statement: bytes, text: bytes
) -> None:
    pgconn = conn.pgconn
    if statement not in prepared:
        try:
            _send(conn, lambda: pgconn.send_prepare(statement, text))
        except errors.DuplicatePreparedStatement:
            # Prepared already (its reply was lost, or this state was cleared): the name
            # can only stand for this text. Inside a transaction the error aborted it.
            if pgconn.transaction_status != pq.TransactionStatus.IDLE:
                prepared.add(statement)
                raise
        prepared.add(statement)


def _run_prepared(
    conn: psycopg.Connection[Any], prepared: set[bytes], text: bytes, values: Any
) -> pq.abc.PGresult:
    pgconn = conn.pgconn
    statement = _statement_name(text)
    _prepare(conn, prepared, statement, text)
    try:
        return _send(conn, lambda: pgconn.send_query_prepared(statement, values))
    except errors.InvalidSqlStatementName:
        # Someone ran DEALLOCATE (ALL) or DISCARD ALL on this session: forget what was
        # prepared, and prepare again unless the failed attempt aborted a transaction.
        prepared.clear()
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise
        return _run_prepared(conn, prepared, text, values)


def _send(conn: psycopg.Connection[Any], send: Callable[[], object]) -> pq.abc.PGresult:
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


def _execute_together(
    conn: psycopg.Connection[Any], steps: Sequence[Step], schema: str
) -> list[Rows[Any]] | None:
    """run_together in one pipeline; None when the connection's state asks for the
    statements one by one (not idle outside a transaction in autocommit)."""
    state = _state(conn)
    with conn.lock:
        pgconn = conn.pgconn
        if not _direct_ok(conn) or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return None
        tx = state.transformer
        try:
            results = _pipeline(conn, _sends(conn, state, steps, schema))
        except errors.InvalidSqlStatementName:
            # DEALLOCATE or DISCARD ALL on this session: nothing ran (the pipeline's
            # transaction aborted); prepare again and send it once more.
            state.prepared.clear()
            results = _pipeline(conn, _sends(conn, state, steps, schema))
        rows: list[Rows[Any]] = []
        for step, result in zip(steps, results, strict=True):
            tx.set_pgresult(result)
            rows.append(_load_each(tx, result) if step.guarded else _load_all(tx, result))
        return rows


def _sends(
    conn: psycopg.Connection[Any], state: _ConnectionState, steps: Sequence[Step], schema: str
) -> list[Callable[[], object]]:
    """A call sending each step (prepared first where it was not yet, once per session)."""
    pgconn, tx = conn.pgconn, state.transformer
    sends: list[Callable[[], object]] = []
    for step in steps:
        text, order = _numbered(step.name, schema)
        values = tx.dump_sequence([step.params[p] for p in order], [PyFormat.TEXT] * len(order))
        if conn.prepare_threshold is None:  # no server-side statements (old PgBouncer)
            sends.append(functools.partial(pgconn.send_query_params, text, values))
        else:
            statement = _statement_name(text)
            _prepare(conn, state.prepared, statement, text)
            sends.append(functools.partial(pgconn.send_query_prepared, statement, values))
    return sends


def _pipeline(
    conn: psycopg.Connection[Any], sends: Sequence[Callable[[], object]]
) -> list[pq.abc.PGresult]:
    """Send the commands and one Sync in pipeline mode, wait for every result; raise the
    first error (the statements after it were skipped, the transaction rolled back)."""
    pgconn = conn.pgconn
    pgconn.enter_pipeline_mode()
    clean = False
    try:
        try:
            for send in sends:
                send()
            pgconn.pipeline_sync()
            conn.wait(generators.send(pgconn))
            serve = getattr(conn, "_pgworkerd_meanwhile", None)
            if serve is not None:
                serve(pgconn.socket)  # (see meanwhile(): until the answer comes)
            results = [conn.wait(generators.fetch_many(pgconn)) for _ in sends]
            synced = conn.wait(generators.fetch_many(pgconn))
        except errors.Error as exc:  # psycopg's convention: no traceback into its internals
            raise exc.with_traceback(None) from None
        if not synced or synced[-1].status != pq.ExecStatus.PIPELINE_SYNC:
            raise errors.InternalError("the pipeline ended without its sync")
        pgconn.exit_pipeline_mode()
        clean = True
    finally:
        if not clean:
            # Results may still be on their way: the connection cannot be trusted with
            # another statement. Closing it makes the caller reconnect.
            conn.close()
    for got in results:
        if not got:
            raise errors.InternalError("got no result from the query")
        if got[-1].status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(got[-1], encoding=conn.info.encoding)
    return [got[-1] for got in results]


# -- the cursor path (public psycopg API only) ---------------------------------------------


def _guarded_via_cursor(
    conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any], schema: str
) -> Rows[tuple[Any, ...] | UnloadableRow]:
    """run_guarded through a cursor (which begins the caller's transaction, raises
    psycopg's errors for a closed or broken connection, and works in pipeline mode)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query(name, schema), params)
        try:
            every = cur.fetchall()  # first: in pipeline mode the description comes with it
            return Rows(every, _described(cur))
        except Exception:
            # A loader's error (psycopg's DataError for a timestamp out of range, json's
            # ValueError, ...) leaves the rows in the cursor's result; a server error,
            # or a result with no rows, does not.
            result = cur.pgresult
            if result is None or result.status != pq.ExecStatus.TUPLES_OK:
                raise
        columns = _described(cur)
        rows: list[tuple[Any, ...] | UnloadableRow] = []
        for row in range(result.ntuples):
            cur.scroll(row, mode="absolute")
            try:
                loaded = cur.fetchone()
            except Exception:
                rows.append(_unloadable(conn, result, row))
            else:
                assert loaded is not None  # row < ntuples
                rows.append(loaded)
        return Rows(rows, columns)


def _unloadable(conn: psycopg.Connection[Any], result: pq.abc.PGresult, row: int) -> UnloadableRow:
    raw = tuple(result.get_value(row, col) for col in range(result.nfields))
    reason = "a value cannot be loaded"
    for col, value in enumerate(raw):
        if value is None:
            continue
        fmt = pq.Format(result.fformat(col))
        loader = conn.adapters.get_loader(result.ftype(col), fmt)
        if loader is None:
            continue  # loaded as text (str or bytes): cannot fail
        try:
            loader(result.ftype(col), conn).load(value)
        except Exception as exc:
            reason = f"{_column_name(result, col)} cannot be loaded: {short_error(exc)}"
            break
    return UnloadableRow(raw, reason)

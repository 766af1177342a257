"""Enqueue inside Django's transaction, on Django's own connection (its psycopg 3 backend,
`django.db.backends.postgresql` with psycopg installed): no second connection, so a job
enqueued inside `transaction.atomic()` commits with the block's writes and is gone if the
block rolls back. Outside an atomic block Django autocommits: the job is enqueued at once.

    from django.db import transaction
    from pgworkerd.contrib import django as jobs

    with transaction.atomic():
        order = Order.objects.create(...)
        jobs.enqueue("send_receipt", {"order": order.pk})

Each function takes `using` (the database alias, default "default") and otherwise what
pgworkerd.enqueue / enqueue_many / enqueue_typed take. A database error (the database's
own bounds) is raised as Django's (django.db.DataError and kin, the psycopg error as its
__cause__) and, inside an atomic block, marks the block for rollback as Django does for
its own queries: a transaction in which a statement failed cannot commit its writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg

from pgworkerd import client
from pgworkerd.client import JobSpec

DEFAULT_DB_ALIAS = "default"


def connection(using: str = DEFAULT_DB_ALIAS) -> psycopg.Connection[Any]:
    """The psycopg Connection under Django's connection `using` (connected if it was not).
    TypeError if that database does not use the psycopg 3 backend."""
    from django.db import connections

    wrapper = connections[using]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            f"Django database {using!r} is not on psycopg 3 (its connection is a "
            f"{type(raw).__module__}.{type(raw).__name__}): pgworkerd needs "
            "django.db.backends.postgresql with psycopg installed"
        )
    return raw


@contextmanager
def _in_django(using: str) -> Iterator[psycopg.Connection[Any]]:
    from django.db import connections

    wrapper = connections[using]
    # a block whose earlier query failed: Django's own refusal, before ours is lost in it
    wrapper.validate_no_broken_transaction()
    raw = connection(using)
    try:
        with wrapper.wrap_database_errors:  # psycopg's errors as Django's
            yield raw
    except psycopg.Error:
        if wrapper.in_atomic_block:
            wrapper.set_rollback(True)
        raise
    except Exception as exc:
        if isinstance(exc.__cause__, psycopg.Error) and wrapper.in_atomic_block:
            wrapper.set_rollback(True)
        raise


def enqueue(
    handler: str,
    payload: Mapping[str, Any] | None = None,
    *,
    using: str = DEFAULT_DB_ALIAS,
    **options: Any,
) -> int:
    """pgworkerd.enqueue on Django's connection `using`, in its current transaction."""
    with _in_django(using) as raw:
        return client.enqueue(raw, handler, payload, **options)


def enqueue_many(
    specs: Iterable[JobSpec], *, using: str = DEFAULT_DB_ALIAS, **options: Any
) -> list[int]:
    """pgworkerd.enqueue_many on Django's connection `using`, in its current transaction."""
    with _in_django(using) as raw:
        return client.enqueue_many(raw, specs, **options)


def enqueue_typed(
    func: Callable[..., Any],
    payload: Any,
    *,
    using: str = DEFAULT_DB_ALIAS,
    **options: Any,
) -> int:
    """pgworkerd.enqueue_typed on Django's connection `using`, in its current transaction."""
    with _in_django(using) as raw:
        return client.enqueue_typed(raw, func, payload, **options)

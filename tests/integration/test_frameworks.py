"""pgworkerd.contrib against a real Django project (settings here, the psycopg 3 backend,
one model) and a real SQLAlchemy session (the psycopg dialect), both on the suite's
PostgreSQL: the job is enqueued on the framework's own connection, inside its transaction
(the transaction itself sees the job, another session does not until it commits), a
commit makes it visible and a rollback removes it with the application's own rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import typedhandlers as th
from daemon_harness import Db
from psycopg.conninfo import conninfo_to_dict

from pgworkerd import JobSpec

ORDERS_DDL = "CREATE TABLE djangoshop_order (id bigserial PRIMARY KEY, customer text NOT NULL)"


def jobs_seen(db: Db) -> list[tuple[str, Any]]:
    """The jobs another session (the test's autocommit connection) sees: committed ones."""
    return [
        (r["handler"], r["payload"])
        for r in db.rows("SELECT handler, payload FROM {schema}.jobs ORDER BY id")
    ]


def orders_seen(db: Db) -> list[str]:
    return [r["customer"] for r in db.rows("SELECT customer FROM djangoshop_order ORDER BY id")]


@pytest.fixture
def orders(db: Db) -> Iterator[None]:
    db.conn.execute(ORDERS_DDL)
    try:
        yield
    finally:
        db.conn.execute("DROP TABLE djangoshop_order")


# -- Django --------------------------------------------------------------------------------


@pytest.fixture
def django_db(test_db_dsn: str, orders: None) -> Iterator[Any]:
    """Django configured for the suite's database (settings.configure holds for the whole
    process: the first test's DSN, which every test of this worker shares)."""
    import django
    from django.conf import settings
    from django.db import connections

    if not settings.configured:
        params = conninfo_to_dict(test_db_dsn)
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": params["dbname"],
                    "USER": params.get("user", ""),
                    "HOST": params.get("host", ""),
                    "PORT": params.get("port", ""),
                    "OPTIONS": {"passfile": params["passfile"]},  # libpq's, as the suite's
                }
            },
            INSTALLED_APPS=["djangoshop"],
            USE_TZ=True,
        )
        django.setup()
    try:
        yield connections["default"]
    finally:
        connections.close_all()


def test_django_enqueue_commits_and_rolls_back_with_the_atomic_block(
    db: Db, django_db: Any
) -> None:
    from django.db import transaction
    from djangoshop.models import Order

    from pgworkerd.contrib import django as jobs

    with transaction.atomic():
        order = Order.objects.create(customer="ada")
        job_id = jobs.enqueue("send_receipt", {"order": order.pk}, schema=db.schema)
        # the same transaction sees the job (Django's own cursor), another session not yet
        with django_db.cursor() as cur:
            cur.execute(f'SELECT handler FROM "{db.schema}".jobs WHERE id = %s', [job_id])
            assert cur.fetchall() == [("send_receipt",)]
        assert jobs_seen(db) == []
        assert jobs.connection() is django_db.connection  # no second connection
    assert jobs_seen(db) == [("send_receipt", {"order": order.pk})]

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        Order.objects.create(customer="bob")
        jobs.enqueue("send_receipt", {"order": -1}, schema=db.schema)
        jobs.enqueue_many([JobSpec("audit"), JobSpec("audit")], schema=db.schema)
        jobs.enqueue_typed(th.bill, th.Invoice(customer="bob", amount_cents=5), schema=db.schema)
        raise Abandon
    assert orders_seen(db) == ["ada"]
    assert jobs_seen(db) == [("send_receipt", {"order": order.pk})]  # the rollback took them

    # outside an atomic block Django autocommits: enqueued at once; a savepoint's rollback
    # (a nested atomic block) takes only its own job
    jobs.enqueue_typed(th.bill, {"customer": "cy", "amount_cents": 7}, schema=db.schema)
    with transaction.atomic():
        jobs.enqueue("kept", schema=db.schema)
        with pytest.raises(Abandon), transaction.atomic():
            jobs.enqueue("undone", schema=db.schema)
            raise Abandon
    assert [h for h, _p in jobs_seen(db)] == ["send_receipt", "bill", "kept"]


def test_django_a_database_refusal_marks_the_atomic_block_for_rollback(
    db: Db, django_db: Any
) -> None:
    from django.db import DataError, transaction
    from django.db.transaction import TransactionManagementError
    from djangoshop.models import Order

    from pgworkerd.contrib import django as jobs

    too_deep: dict[str, Any] = {}
    for _ in range(300):  # beyond the database's 255 levels
        too_deep = {"a": too_deep}
    with transaction.atomic():
        Order.objects.create(customer="dee")
        with pytest.raises(DataError) as refused:
            jobs.enqueue("deep", too_deep, schema=db.schema)
        assert isinstance(refused.value.__cause__, psycopg.errors.InvalidParameterValue)
        # as after a failed query of Django's own: nothing more in this block
        with pytest.raises(TransactionManagementError):
            Order.objects.create(customer="eve")
        with pytest.raises(TransactionManagementError):
            jobs.enqueue("after", schema=db.schema)
    assert (orders_seen(db), jobs_seen(db)) == ([], [])


# -- SQLAlchemy ----------------------------------------------------------------------------


@pytest.fixture
def engine(test_db_dsn: str, orders: None) -> Iterator[Any]:
    """One connection at most (pool_size 1, no overflow): a helper that opened a second
    one would block, then fail."""
    import sqlalchemy

    params = conninfo_to_dict(test_db_dsn)
    url = sqlalchemy.URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        database=params["dbname"],
        query={"host": params["host"], "port": params["port"], "passfile": params["passfile"]},
    )
    made = sqlalchemy.create_engine(url, pool_size=1, max_overflow=0, pool_timeout=5)
    try:
        yield made
    finally:
        made.dispose()


def test_sqlalchemy_enqueue_commits_and_rolls_back_with_the_session(db: Db, engine: Any) -> None:
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from pgworkerd.contrib import sqlalchemy as jobs

    insert = text("INSERT INTO djangoshop_order (customer) VALUES (:c) RETURNING id")
    with Session(engine) as session:
        order = session.execute(insert, {"c": "ada"}).scalar_one()
        job_id = jobs.enqueue(session, "send_receipt", {"order": order}, schema=db.schema)
        # the session's transaction sees it, another session does not yet
        seen = session.execute(
            text(f'SELECT handler FROM "{db.schema}".jobs WHERE id = :id'), {"id": job_id}
        ).all()
        assert [tuple(r) for r in seen] == [("send_receipt",)]
        assert jobs_seen(db) == []
        session.commit()
    assert jobs_seen(db) == [("send_receipt", {"order": order})]

    with Session(engine) as session:
        session.execute(insert, {"c": "bob"})
        jobs.enqueue_many(session, [JobSpec("audit")], schema=db.schema)
        jobs.enqueue_typed(
            session, th.bill, {"customer": "bob", "amount_cents": 3}, schema=db.schema
        )
        session.rollback()
    assert orders_seen(db) == ["ada"]
    assert jobs_seen(db) == [("send_receipt", {"order": order})]

    # a Session with nothing begun yet, and a Connection committing as it goes
    with Session(engine) as session:
        jobs.enqueue(session, "first", schema=db.schema)
        assert jobs_seen(db) == [("send_receipt", {"order": order})]
        session.commit()
    with engine.connect() as conn:
        jobs.enqueue(conn, "second", schema=db.schema)
        conn.rollback()
        jobs.enqueue(conn, "third", schema=db.schema)
        conn.commit()
    assert [h for h, _p in jobs_seen(db)] == ["send_receipt", "first", "third"]


def test_sqlalchemy_refuses_what_is_not_a_psycopg_session(db: Db, engine: Any) -> None:
    from pgworkerd.contrib import sqlalchemy as jobs

    with pytest.raises(TypeError, match="expected a sqlalchemy Session or Connection, not Engine"):
        jobs.enqueue(engine, "x", schema=db.schema)
    with pytest.raises(TypeError, match="expected a sqlalchemy Session or Connection"):
        jobs.enqueue(db.conn, "x", schema=db.schema)

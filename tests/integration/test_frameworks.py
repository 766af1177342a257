"""pgworkerd.contrib against a real Django project (settings here, the psycopg 3 backend,
one model: tests/support/shop) and a real SQLAlchemy session (the psycopg dialect), both on
the suite's PostgreSQL: the job is enqueued on the framework's own connection, inside its
transaction (the transaction itself sees the job, another session does not until it
commits), a commit makes it visible and a rollback removes it with the application's own
rows. The examples of docs/guide/frameworks.md run here as written.

The application's database is one of its own with pgworkerd in its default schema (the
docs' examples name no schema); Django's settings are configured once per process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import typedhandlers as th
from doctext import block_after
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from pgworkerd import JobSpec
from pgworkerd.devcluster.localpg import LocalPostgres

APP_DB = "pgworkerd_frameworks"
ORDERS_DDL = "CREATE TABLE shop_order (id bigserial PRIMARY KEY, customer text NOT NULL)"


class Seen:
    """What another session (autocommit) sees of the application's database: committed rows."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def jobs(self) -> list[tuple[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute("SELECT handler, payload FROM pgworkerd.jobs ORDER BY id")
            return [(r["handler"], r["payload"]) for r in rows]

    def orders(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT customer FROM shop_order ORDER BY id")]


@pytest.fixture
def app_dsn(pg: LocalPostgres) -> Iterator[str]:
    """The application's database: pgworkerd migrated into its default schema, and the
    shop's table; both dropped afterwards."""
    from pgworkerd.queue.migrate import migrate

    pg.create_database(APP_DB)
    dsn = pg.dsn(APP_DB)
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(ORDERS_DDL)
    try:
        yield dsn
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DROP TABLE shop_order")
            c.execute("DROP SCHEMA pgworkerd CASCADE")


@pytest.fixture
def seen(app_dsn: str) -> Iterator[Seen]:
    with psycopg.connect(app_dsn, autocommit=True) as c:
        yield Seen(c)


# -- Django --------------------------------------------------------------------------------


@pytest.fixture
def django_db(app_dsn: str) -> Iterator[Any]:
    """Django's connection to the application's database (configured once per process)."""
    import django
    from django.conf import settings
    from django.db import connections

    if not settings.configured:
        params = conninfo_to_dict(app_dsn)
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
            INSTALLED_APPS=["shop"],
            USE_TZ=True,
        )
        django.setup()
    try:
        yield connections["default"]
    finally:
        connections.close_all()


def test_django_enqueue_commits_and_rolls_back_with_the_atomic_block(
    seen: Seen, django_db: Any
) -> None:
    from django.db import transaction
    from shop.models import Order

    from pgworkerd.contrib import django as jobs

    with transaction.atomic():
        order = Order.objects.create(customer="ada")
        job_id = jobs.enqueue("send_receipt", {"order": order.pk})
        # the same transaction sees the job (Django's own cursor), another session not yet
        with django_db.cursor() as cur:
            cur.execute("SELECT handler FROM pgworkerd.jobs WHERE id = %s", [job_id])
            assert cur.fetchall() == [("send_receipt",)]
        assert seen.jobs() == []
        assert jobs.connection() is django_db.connection  # no second connection
    assert seen.jobs() == [("send_receipt", {"order": order.pk})]

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        Order.objects.create(customer="bob")
        jobs.enqueue("send_receipt", {"order": -1})
        jobs.enqueue_many([JobSpec("audit"), JobSpec("audit")])
        jobs.enqueue_typed(th.bill, th.Invoice(customer="bob", amount_cents=5))
        raise Abandon
    assert seen.orders() == ["ada"]
    assert seen.jobs() == [("send_receipt", {"order": order.pk})]  # the rollback took them

    # outside an atomic block Django autocommits: enqueued at once; a savepoint's rollback
    # (a nested atomic block) takes only its own job
    jobs.enqueue_typed(th.bill, {"customer": "cy", "amount_cents": 7})
    with transaction.atomic():
        jobs.enqueue("kept")
        with pytest.raises(Abandon), transaction.atomic():
            jobs.enqueue("undone")
            raise Abandon
    assert [h for h, _p in seen.jobs()] == ["send_receipt", "bill", "kept"]


def test_django_a_database_refusal_marks_the_atomic_block_for_rollback(
    seen: Seen, django_db: Any
) -> None:
    from django.db import DataError, transaction
    from django.db.transaction import TransactionManagementError
    from shop.models import Order

    from pgworkerd.contrib import django as jobs

    too_deep: dict[str, Any] = {}
    for _ in range(300):  # beyond the database's 255 levels
        too_deep = {"a": too_deep}
    with transaction.atomic():
        Order.objects.create(customer="dee")
        with pytest.raises(DataError) as refused:
            jobs.enqueue("deep", too_deep)
        assert isinstance(refused.value.__cause__, psycopg.errors.InvalidParameterValue)
        # as after a failed query of Django's own: nothing more in this block
        with pytest.raises(TransactionManagementError):
            Order.objects.create(customer="eve")
        with pytest.raises(TransactionManagementError):
            jobs.enqueue("after")
    assert (seen.orders(), seen.jobs()) == ([], [])


def test_the_django_example_of_the_docs_runs(seen: Seen, django_db: Any) -> None:
    example: dict[str, Any] = {}
    exec(block_after("guide/frameworks.md", "python", "## Django"), example)
    order = example["place_order"]("ada")
    assert (seen.orders(), seen.jobs()) == (["ada"], [("send_receipt", {"order": order})])


# -- SQLAlchemy ----------------------------------------------------------------------------


@pytest.fixture
def engine(app_dsn: str) -> Iterator[Any]:
    """One connection at most (pool_size 1, no overflow): a helper that opened a second
    one would block, then fail."""
    import sqlalchemy

    params = conninfo_to_dict(app_dsn)
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


def test_sqlalchemy_enqueue_commits_and_rolls_back_with_the_session(
    seen: Seen, engine: Any
) -> None:
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from pgworkerd.contrib import sqlalchemy as jobs

    insert = text("INSERT INTO shop_order (customer) VALUES (:c) RETURNING id")
    with Session(engine) as session:
        order = session.execute(insert, {"c": "ada"}).scalar_one()
        job_id = jobs.enqueue(session, "send_receipt", {"order": order})
        # the session's transaction sees it, another session does not yet
        found = session.execute(
            text("SELECT handler FROM pgworkerd.jobs WHERE id = :id"), {"id": job_id}
        ).all()
        assert [tuple(r) for r in found] == [("send_receipt",)]
        assert seen.jobs() == []
        session.commit()
    assert seen.jobs() == [("send_receipt", {"order": order})]

    with Session(engine) as session:
        session.execute(insert, {"c": "bob"})
        jobs.enqueue_many(session, [JobSpec("audit")])
        jobs.enqueue_typed(session, th.bill, {"customer": "bob", "amount_cents": 3})
        session.rollback()
    assert seen.orders() == ["ada"]
    assert seen.jobs() == [("send_receipt", {"order": order})]

    # a Session with nothing begun yet, and a Connection committing as it goes
    with Session(engine) as session:
        jobs.enqueue(session, "first")
        assert seen.jobs() == [("send_receipt", {"order": order})]
        session.commit()
    with engine.connect() as conn:
        jobs.enqueue(conn, "second")
        conn.rollback()
        jobs.enqueue(conn, "third")
        conn.commit()
    assert [h for h, _p in seen.jobs()] == ["send_receipt", "first", "third"]


def test_sqlalchemy_refuses_what_is_not_a_psycopg_session(seen: Seen, engine: Any) -> None:
    from pgworkerd.contrib import sqlalchemy as jobs

    with pytest.raises(TypeError, match="expected a sqlalchemy Session or Connection, not Engine"):
        jobs.enqueue(engine, "x")
    with pytest.raises(TypeError, match="expected a sqlalchemy Session or Connection"):
        jobs.enqueue(seen.conn, "x")
    assert seen.jobs() == []


def test_the_sqlalchemy_example_of_the_docs_runs(seen: Seen, engine: Any) -> None:
    example: dict[str, Any] = {}
    exec(block_after("guide/frameworks.md", "python", "## SQLAlchemy"), example)
    order = example["place_order"](engine, "ada")
    assert (seen.orders(), seen.jobs()) == (["ada"], [("send_receipt", {"order": order})])

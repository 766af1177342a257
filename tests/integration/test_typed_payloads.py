"""Typed payloads against real daemons, real children and a real PostgreSQL: a handler
annotated with a dataclass or a Pydantic model gets its payload validated and typed; a
payload that no longer validates ends the job dead at once (one attempt recorded, the
reason naming the field); enqueue_typed refuses a bad payload before the database; the
daemon refuses a payload type with no JSON form at start; `payload-schema` exports the
schemas."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest
import typedhandlers as th
from daemon_harness import Daemons, Db
from doctext import block_after, blocks, page

import pgworkerd
from pgworkerd import JobSpec
from pgworkerd.devcluster.localpg import LocalPostgres

H = "typedhandlers"
HANDLERS = {
    "resize": {"target": f"{H}:resize"},
    "bill": {"target": f"{H}:bill"},
    "plain": {"target": f"{H}:plain"},
    "count_nodes": {"target": f"{H}:count_nodes"},
}


def test_a_typed_handler_gets_its_payload_validated_and_typed(daemons: Daemons, db: Db) -> None:
    daemons.start(HANDLERS)
    request = th.ResizeRequest("a.png", th.Size(3, 4), th.Format.JPEG, ["x"])
    with db.conn.transaction():
        resized = pgworkerd.enqueue_typed(db.conn, th.resize, request, schema=db.schema)
        # a mapping is validated the same way (defaults filled in), and JobSpec.typed
        # serves enqueue_many
        [billed] = pgworkerd.enqueue_many(
            db.conn,
            [JobSpec.typed(th.bill, {"customer": "c1", "amount_cents": 250}, priority=-1)],
            schema=db.schema,
        )
    tree = th.Node("root", [th.Node("a", [th.Node("a1")]), th.Node("b")])
    counted = pgworkerd.enqueue_typed(db.conn, th.count_nodes, tree, schema=db.schema)
    row = db.wait_status(resized, "completed", "dead", timeout=60)
    assert row["status"] == "completed", row["last_error"]
    assert row["result"] == {
        "request": "ResizeRequest",
        "size": "Size",
        "area": 12,
        "format": "JPEG",
        "tags": ["x"],
        "raw": {
            "path": "a.png",
            "size": {"width": 3, "height": 4},
            "format": "jpeg",
            "tags": ["x"],
        },
    }
    row = db.wait_status(billed, "completed", "dead", timeout=60)
    assert row["status"] == "completed", row["last_error"]
    assert (row["result"], row["handler"], row["priority"]) == (
        {"model": "Invoice", "amount": 250},
        "bill",
        -1,
    )
    assert db.wait_status(counted, "completed", timeout=60)["result"] == 4


def test_a_payload_that_no_longer_validates_is_dead_at_once_naming_the_field(
    daemons: Daemons, db: Db
) -> None:
    """Jobs enqueued untyped (from SQL, an older release, another language) whose payload
    does not fit the handler's type: one attempt, recorded, then dead; no retry."""
    daemons.start(HANDLERS)
    bad = {
        # a field of a nested dataclass of the wrong JSON type
        "wrong type": db.enqueue("resize", {"path": "a", "size": {"width": "3", "height": 4}}),
        # a renamed field: the old name is unknown, the new one missing
        "renamed": db.enqueue("resize", {"file": "a", "size": {"width": 3, "height": 4}}),
        # __post_init__ refuses the values
        "refused": db.enqueue("resize", {"path": "a", "size": {"width": 0, "height": 4}}),
        # Pydantic's own constraint
        "pydantic": db.enqueue("bill", {"customer": "c", "amount_cents": -5}),
    }
    expected = {
        "wrong type": "payload does not validate as ResizeRequest (not retried): "
        "size.width: expected an integer, not string",
        "renamed": "payload does not validate as ResizeRequest (not retried): "
        "'file': unknown field of ResizeRequest",
        "refused": "payload does not validate as ResizeRequest (not retried): size: "
        "Size refused it: width and height must be positive",
        "pydantic": "payload does not validate as Invoice (not retried): amount_cents: "
        "Input should be greater than 0",
    }
    for what, job_id in bad.items():
        row = db.wait_status(job_id, "dead", "completed", timeout=60)
        assert row["status"] == "dead", (what, row)
        assert row["attempts"] == 1, (what, row)  # max_attempts 5: not retried
        assert row["last_error"] == expected[what], what
        attempts = db.rows(
            "SELECT outcome, error FROM {schema}.attempts WHERE job_id = %s", (job_id,)
        )
        assert [(a["outcome"], a["error"]) for a in attempts] == [("dead", expected[what])]
    # an untyped handler is called as ever
    plain = db.enqueue("plain", {"anything": [1, "two"]})
    assert db.wait_status(plain, "completed", timeout=60)["result"] == {"anything": [1, "two"]}


def test_enqueue_typed_refuses_a_bad_payload_before_the_database(db: Db) -> None:
    cases = [
        # a dataclass does not check its fields' types when built: enqueue_typed does
        (
            th.ResizeRequest("a", th.Size(3, 4), "png"),  # type: ignore[arg-type]
            "payload does not validate as ResizeRequest: format: expected a Format, not str",
        ),
        (
            {"path": "a", "size": {"width": 1, "height": 1}, "colour": "red"},
            "payload does not validate as ResizeRequest: 'colour': unknown field of ResizeRequest",
        ),
        (th.Invoice(customer="c", amount_cents=1), "expected a ResizeRequest, not Invoice"),
    ]
    for payload, message in cases:
        with pytest.raises(pgworkerd.InvalidJob) as refused:
            pgworkerd.enqueue_typed(db.conn, th.resize, payload, schema=db.schema)
        assert message in str(refused.value)
    with pytest.raises(pgworkerd.InvalidJob, match="declares no typed payload"):
        pgworkerd.enqueue_typed(db.conn, th.plain, {}, schema=db.schema)
    # a value that refers to itself (a recursive type allows it): refused, not a crash
    looped = th.Node("loop")
    looped.children.append(looped)
    with pytest.raises(pgworkerd.InvalidJob, match="refers to itself or nests too deeply"):
        pgworkerd.enqueue_typed(db.conn, th.count_nodes, looped, schema=db.schema)
    # the existing bounds still apply: a payload beyond 64 MiB is refused by the database
    huge = th.ResizeRequest("a" * (65 << 20), th.Size(1, 1))
    too_big = pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 64 MiB")
    with too_big, db.conn.transaction():
        pgworkerd.enqueue_typed(db.conn, th.resize, huge, schema=db.schema)
    assert db.rows("SELECT count(*) AS n FROM {schema}.jobs") == [{"n": 0}]


def test_the_daemon_refuses_a_payload_type_without_a_json_form(daemons: Daemons) -> None:
    for target, said in (
        (
            "bad_type",
            "handler 'broken': handler 'bad_type' parameter 'payload': ids: type 'set' cannot "
            "be a JSON value",
        ),
        ("untyped_second", "which is neither a dataclass nor a Pydantic model"),
    ):
        config = daemons.config({"broken": {"target": f"{H}:{target}"}})
        checked = daemons.cli("--config", str(config), "check-config")
        assert checked.returncode == 6, checked
        assert said in checked.stderr, checked.stderr


def test_payload_schema_exports_each_typed_handlers_schema(daemons: Daemons) -> None:
    config = str(daemons.config(HANDLERS))
    every = daemons.cli("--config", config, "payload-schema")
    assert every.returncode == 0, every
    schemas = json.loads(every.stdout)
    assert sorted(schemas) == ["bill", "count_nodes", "resize"]  # the untyped handler has none
    one = daemons.cli("--config", config, "payload-schema", "resize")
    assert one.returncode == 0, one
    resize = json.loads(one.stdout)
    assert resize == schemas["resize"]
    # an independent validator agrees with the handler's own checks
    validator = jsonschema.Draft202012Validator(resize)
    validator.check_schema(resize)
    assert validator.is_valid({"path": "a", "size": {"width": 1, "height": 2}, "format": "png"})
    assert not validator.is_valid({"path": "a", "size": {"width": "1", "height": 2}})
    assert not validator.is_valid({"file": "a", "size": {"width": 1, "height": 2}})
    bill = jsonschema.Draft202012Validator(schemas["bill"])
    assert bill.is_valid({"customer": "c", "amount_cents": 3})
    assert not bill.is_valid({"customer": "c", "amount_cents": 0})

    untyped = daemons.cli("--config", config, "payload-schema", "plain")
    assert untyped.returncode == 1 and "declares no typed payload" in untyped.stderr, untyped
    unknown = daemons.cli("--config", config, "payload-schema", "nope")
    assert unknown.returncode == 2 and "no handler 'nope'" in unknown.stderr, unknown


def test_the_handlers_page_typed_example_runs(
    pg: LocalPostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/guide/handlers.md "Typed payloads": its handler modules, served by a daemon,
    and its enqueue example, run as written (pgworkerd in its default schema)."""
    from pgworkerd.queue.migrate import migrate

    for block in blocks(page("guide/handlers.md")):
        if block.options.get("module", "").startswith("myapp/"):
            path = tmp_path / block.options["module"]
            path.parent.mkdir(exist_ok=True)
            path.write_text(block.body)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the daemon's children import myapp
    monkeypatch.syspath_prepend(str(tmp_path))  # and so does the example, here
    pg.create_database("pgworkerd_typed_docs")
    dsn = pg.dsn("pgworkerd_typed_docs")
    migrate(dsn)
    daemons = Daemons(tmp_path, dsn, "pgworkerd")
    try:
        daemons.start(
            {
                "resize": {"target": "myapp.images:resize"},
                "bill": {"target": "myapp.billing:bill"},
            }
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            example: dict[str, Any] = {"conn": conn}
            enqueuing = "Enqueue with `pgworkerd.enqueue_typed`"
            exec(block_after("guide/handlers.md", "python", enqueuing), example)
            assert pgworkerd.wait(conn, example["job_id"], timeout=60) == {
                "resized": "cat.jpg",
                "to": [640, 480],
            }
            for n, job_id in enumerate(example["more"]):
                assert pgworkerd.wait(conn, job_id, timeout=60)["resized"] == f"{n}.jpg"
            # the page's failure message, word for word
            bad = pgworkerd.enqueue(conn, "resize", {"path": "a", "width": "64", "height": 64})
            with pytest.raises(pgworkerd.JobFailed) as failed:
                pgworkerd.wait(conn, bad, timeout=60)
            assert failed.value.error is not None
            assert f"`{failed.value.error}`" in page("guide/handlers.md").read_text()
            billing = importlib.import_module("myapp.billing")
            invoice = billing.Invoice(customer="c", amount_cents=12)
            billed = pgworkerd.enqueue_typed(conn, billing.bill, invoice)
            assert pgworkerd.wait(conn, billed, timeout=60) == 12
    finally:
        daemons.stop_all()
        for name in ("myapp", "myapp.images", "myapp.billing"):
            sys.modules.pop(name, None)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DROP SCHEMA pgworkerd CASCADE")

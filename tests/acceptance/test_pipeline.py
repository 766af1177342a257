"""docs/guide/pipeline.md, as printed, with a real daemon: probe -> N transcodes ->
stitch -> publish (after an approval signal). Its SQL, handlers and config are the page's
blocks (the schema and role names of this test's database swapped in), its shell commands
run through bash as the application's enqueuer login, exactly as the page shows them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Daemons, Db
from doctext import block_after
from psycopg import sql

PAGE = "guide/pipeline.md"
LEASE = {"lease": "4s", "renew_interval": "1s", "poll_interval": "1s", "backoff": "0s"}
BIN = Path(sys.executable).parent


def set_up(db: Db, tmp_path: Path, roles: dict[str, str], extra: str = "") -> dict[str, Any]:
    """The page's table and module, for this test's schema and roles; returns the
    handlers of the page's config (extra: code appended to the module)."""
    schema = db.schema
    media, enqueuer = f"{schema}_media", f"{schema}_enqueuer"
    ddl = block_after(PAGE, "sql", "## The application's table")
    ddl = ddl.replace("media.", f"{media}.").replace("SCHEMA media", f"SCHEMA {media}")
    db.conn.execute(ddl.replace("pgworkerd_enqueuer", enqueuer).encode())
    code = block_after(PAGE, "python", "## The handlers")
    code = code.replace("pgworkerd.job_lease_assert", f"{schema}.job_lease_assert")
    code = code.replace("media.fan_outs", f"{media}.fan_outs")
    enqueue = "pgworkerd.enqueue_many(conn, [*segments, stitch, publish])"
    assert enqueue in code
    code = code.replace(enqueue, enqueue[:-1] + f", schema={schema!r})")
    (tmp_path / "media_pipeline.py").write_text(code + extra)
    return tomllib.loads(block_after(PAGE, "toml", "## The daemon's configuration"))["handlers"]


def shell(block: str, roles: dict[str, str], schema: str) -> str:
    """One of the page's shell blocks, through bash, as its first line's role."""
    role = block.split("\n", 1)[0].removeprefix("# as pgworkerd_")
    dsn = roles[f"{schema}_{role}"]
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PGWORKERD_DSN": dsn,
        "PGWORKERD_SCHEMA": schema,
    }
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, (block, proc.stdout, proc.stderr)
    return proc.stdout


def by_handler(db: Db, handler: str) -> list[dict[str, Any]]:
    return db.rows(
        "SELECT id, status::text, payload, result, attempts, started_at, finished_at"
        " FROM {schema}.jobs WHERE handler = %s ORDER BY id",
        (handler,),
    )


def test_the_pipeline_page_runs_end_to_end(
    db: Db,
    daemons: Daemons,
    tmp_path: Path,
    roles: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe fans out four transcodes (200 s in 60 s segments), the stitch starts only
    once all four completed and reads their results, the publish step waits for the
    approval signal sent by key with `pgworkerd signal`, then publishes."""
    schema, dsn = db.schema, roles[f"{db.schema}_enqueuer"]
    handlers = set_up(db, tmp_path, roles)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("MEDIA_DSN", dsn)
    daemons.start(handlers, {**LEASE, "slots": 4})

    out = shell(block_after(PAGE, "sh", "## Running it"), roles, schema)
    probe_id = int(out.strip())
    probe = db.wait_status(probe_id, "completed", "dead")
    assert probe["status"] == "completed", probe["last_error"]
    assert probe["result"]["segments"] == 4
    stitch_id, publish_id = probe["result"]["stitch"], probe["result"]["publish"]

    # the publish step reached its wait: the page's listing shows it
    db.wait_status(publish_id, "suspended", "dead", "completed")
    listing = shell(block_after(PAGE, "sh", "## Running it", 1), roles, schema)
    assert str(publish_id) in listing and "suspended" in listing, listing

    transcodes = by_handler(db, "transcode")
    assert [t["status"] for t in transcodes] == ["completed"] * 4
    assert [(t["payload"]["start"], t["payload"]["end"]) for t in transcodes] == [
        (0, 60), (60, 120), (120, 180), (180, 200)
    ]  # fmt: skip
    [stitch] = by_handler(db, "stitch")
    assert stitch["id"] == stitch_id and stitch["status"] == "completed"
    # started only after the last segment completed, and read every segment's result
    assert stitch["started_at"] >= max(t["finished_at"] for t in transcodes)
    assert stitch["result"] == {
        "file": "talk.final.mp4",
        "parts": [t["result"]["file"] for t in transcodes],
        "seconds": 200,
    }
    parents = db.rows(
        "SELECT parent_id FROM {schema}.job_parents WHERE child_id = %s ORDER BY parent_id",
        (stitch_id,),
    )
    assert [p["parent_id"] for p in parents] == [t["id"] for t in transcodes]
    assert db.job(publish_id)["status"] == "suspended"

    shell(block_after(PAGE, "sh", "## Running it", 2), roles, schema)
    publish = db.wait_status(publish_id, "completed", "dead")
    assert publish["result"] == {"published": True, "file": "talk.final.mp4", "by": "ana"}
    # the wait cost no attempt: one to wait, one to publish, both in the history
    outcomes = db.rows(
        "SELECT outcome FROM {schema}.attempts WHERE job_id = %s ORDER BY attempt, finished_at",
        (publish_id,),
    )
    assert [o["outcome"] for o in outcomes] == ["waited", "completed"]
    fan_outs = db.conn.execute(
        sql.SQL("SELECT probe_job_id, job_ids FROM {}.fan_outs").format(
            sql.Identifier(f"{schema}_media")
        )
    ).fetchall()
    assert fan_outs == [(probe_id, [*(t["id"] for t in transcodes), stitch_id, publish_id])]


# The probe's first attempt fails after its fan-out committed (as a daemon killed between
# the two would leave it): the retry must find the fan-out and enqueue nothing again.
FAIL_AFTER_FAN_OUT = """

_probe = probe


def probe(job: JobContext) -> dict:
    result = _probe(job)
    if job.attempt == 1:
        raise RuntimeError("lost after the fan-out")
    return result
"""


def test_a_retried_probe_enqueues_its_segments_once(
    db: Db,
    daemons: Daemons,
    tmp_path: Path,
    roles: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page's probe, failing once after its transaction committed: the second attempt
    completes with the same ids, and each transcode, the stitch and the publish step
    exist once."""
    schema, dsn = db.schema, roles[f"{db.schema}_enqueuer"]
    handlers = set_up(db, tmp_path, roles, FAIL_AFTER_FAN_OUT)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("MEDIA_DSN", dsn)
    # only the probe is served: the rest stays pending, to be counted
    daemons.start({"probe": handlers["probe"]}, LEASE)
    out = shell(block_after(PAGE, "sh", "## Running it"), roles, schema)
    probe = db.wait_status(int(out), "completed", "dead")
    assert probe["status"] == "completed", probe["last_error"]
    assert probe["attempts"] == 2 and "lost after the fan-out" in probe["last_error"]
    assert len(by_handler(db, "transcode")) == 4
    assert [s["id"] for s in by_handler(db, "stitch")] == [probe["result"]["stitch"]]
    assert [p["id"] for p in by_handler(db, "publish")] == [probe["result"]["publish"]]

"""Acceptance tier: OpenTelemetry traces (the `otel` extra; docs/operations/tracing.md)
with the real daemon and real job children.

The test process traces a "request" with the SDK's InMemorySpanExporter and enqueues
inside it; the daemon and each child build their providers from
tests/support/tracehandlers.py:provider, whose spans reach files through the SDK's
exporter (each child is another process: its memory is gone when it exits). What is
checked is what a trace backend shows: the attempt's span linked to (or a child of) the
request, the handler's own span under the attempt, one span per attempt with its outcome,
and the daemon's claim and outcome-write spans linked to the request.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, Daemons, Db, wait_for
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span
from tracehandlers import spans

HANDLERS = {
    "traced": {"target": "tracehandlers:traced"},
    "fails_once": {"target": "tracehandlers:fails_once"},
    "always_fails": {"target": "tracehandlers:always_fails"},
    "sleeps": {"target": "tracehandlers:sleeps"},
    "enqueues_a_follow_up": {"target": "tracehandlers:enqueues_a_follow_up"},
    "traced_async": {"target": "tracehandlers:traced_async", "concurrency": 2},
}


@pytest.fixture
def span_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "spans"
    directory.mkdir()
    monkeypatch.setenv("TRACEHANDLERS_DIR", str(directory))
    return directory


@pytest.fixture
def request_tracer() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The application's tracer provider (not installed globally: the current span is
    what the enqueue reads)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def start(daemons: Daemons, **tracing: Any) -> DaemonProcess:
    return daemons.start(
        HANDLERS,
        {"backoff": "0s"},
        tables={"tracing": {"enabled": True, "provider": "tracehandlers:provider", **tracing}},
    )


def hex_ids(span: Span) -> tuple[str, str]:
    """A span's (trace id, span id) as Span.to_json writes them."""
    context = span.get_span_context()
    return f"0x{context.trace_id:032x}", f"0x{context.span_id:016x}"


def attempt_spans(directory: Path, job_id: int, count: int) -> list[dict[str, Any]]:
    """The job's attempt spans once `count` of them were exported, by attempt."""
    found = wait_for(
        lambda: (
            len(
                found := [
                    s
                    for s in spans(directory)
                    if s["attributes"].get("pgworkerd.job.id") == job_id
                    and s["name"].startswith("pgworkerd job ")
                ]
            )
            >= count
            and found
        ),
        what=f"{count} attempt span(s) of job {job_id}",
    )
    return sorted(found, key=lambda s: s["attributes"]["pgworkerd.job.attempt"])


def linked_to(span: dict[str, Any], ids: tuple[str, str]) -> list[dict[str, Any]]:
    return [
        link
        for link in span["links"]
        if (link["context"]["trace_id"], link["context"]["span_id"]) == ids
    ]


def test_an_attempt_links_to_the_enqueuing_request_and_the_handlers_span_nests_under_it(
    db: Db,
    daemons: Daemons,
    span_dir: Path,
    request_tracer: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = request_tracer
    daemon = start(daemons)
    with provider.get_tracer("app").start_as_current_span("POST /reports") as request:
        job_id = db.enqueue("traced", {"n": 1})
    request_ids = hex_ids(request)
    assert [s.name for s in exporter.get_finished_spans()] == ["POST /reports"]
    stored = db.rows("SELECT trace_context FROM {schema}.jobs WHERE id = %s", (job_id,))
    traceparent = stored[0]["trace_context"]["traceparent"]
    assert traceparent.split("-")[:3] == ["00", request_ids[0][2:], request_ids[1][2:]]
    db.wait_status(job_id, "completed")

    [attempt] = attempt_spans(span_dir, job_id, 1)
    assert attempt["name"] == "pgworkerd job traced"
    assert attempt["kind"] == "SpanKind.CONSUMER"
    assert attempt["parent_id"] is None  # a trace of its own (attempt_parent = "link")
    assert attempt["context"]["trace_id"] != request_ids[0]
    assert len(linked_to(attempt, request_ids)) == 1
    assert attempt["status"]["status_code"] == "OK"
    attributes = attempt["attributes"]
    assert attributes["pgworkerd.job.handler"] == "traced"
    assert attributes["pgworkerd.job.queue"] == "default"
    assert attributes["pgworkerd.job.attempt"] == 1
    assert attributes["pgworkerd.job.outcome"] == "completed"
    assert attributes["pgworkerd.job.cpu_user_seconds"] >= 0
    assert attributes["pgworkerd.job.peak_memory_bytes"] > 1 << 20  # a Python process

    [work] = [s for s in spans(span_dir) if s["name"] == "handler work"]
    assert work["context"]["trace_id"] == attempt["context"]["trace_id"]
    assert work["parent_id"] == attempt["context"]["span_id"]
    assert work["attributes"]["work.job"] == job_id

    # the daemon's claim and outcome write, linked to the request too: exported when the
    # daemon leaves, at the latest (its provider's schedule is longer than the test)
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0

    def daemon_span(name: str) -> dict[str, Any] | None:
        return next(
            (s for s in spans(span_dir) if s["name"] == name and linked_to(s, request_ids)),
            None,
        )

    claim = wait_for(lambda: daemon_span("pgworkerd claim"), what="the claim's span")
    assert claim["attributes"]["pgworkerd.claim.jobs"] >= 1
    assert linked_to(claim, request_ids)[0]["attributes"]["pgworkerd.job.id"] == job_id
    # (the outcome rides on the next claim or is written alone: either span links it)
    written = wait_for(
        lambda: next(
            (
                link
                for s in spans(span_dir)
                if s["name"] in ("pgworkerd claim", "pgworkerd record outcomes")
                for link in linked_to(s, request_ids)
                if link["attributes"].get("pgworkerd.job.outcome") == "complete"
            ),
            None,
        ),
        what="the outcome write's link",
    )
    assert written["attributes"]["pgworkerd.job.id"] == job_id


def test_async_jobs_side_by_side_each_have_their_attempt_span_and_their_own_nesting(
    db: Db,
    daemons: Daemons,
    span_dir: Path,
    request_tracer: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = request_tracer
    start(daemons)
    with provider.get_tracer("app").start_as_current_span("POST /batch") as request:
        ids = [db.enqueue("traced_async", {"n": n}) for n in range(2)]
    request_ids = hex_ids(request)
    for job_id in ids:
        db.wait_status(job_id, "completed")

    def handler_spans() -> list[dict[str, Any]]:
        return [s for s in spans(span_dir) if s["name"] == "async handler work"]

    wait_for(lambda: len(handler_spans()) >= 2, what="the handlers' spans")
    work = {s["attributes"]["work.job"]: s for s in handler_spans()}
    attempts = {job_id: attempt_spans(span_dir, job_id, 1)[0] for job_id in ids}
    # they ran side by side (one child, concurrency = 2): every attempt began before any
    # ended (Span.to_json's times are ISO 8601 UTC strings of one form: they sort)
    assert max(a["start_time"] for a in attempts.values()) < min(
        a["end_time"] for a in attempts.values()
    ), attempts
    for job_id, attempt in attempts.items():
        assert attempt["attributes"]["pgworkerd.job.outcome"] == "completed"
        assert len(linked_to(attempt, request_ids)) == 1
        assert "pgworkerd.job.cpu_user_seconds" not in attempt["attributes"]  # shared process
        # its own handler's span nests under its own attempt, not a neighbour's
        assert work[job_id]["parent_id"] == attempt["context"]["span_id"]
        assert work[job_id]["context"]["trace_id"] == attempt["context"]["trace_id"]


def test_a_retried_job_has_one_span_per_attempt_and_a_failed_attempt_is_an_error(
    db: Db,
    daemons: Daemons,
    span_dir: Path,
    request_tracer: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = request_tracer
    start(daemons)
    with provider.get_tracer("app").start_as_current_span("enqueue") as request:
        retried = db.enqueue("fails_once", max_attempts=3)
        dead = db.enqueue("always_fails", max_attempts=1)
    request_ids = hex_ids(request)
    db.wait_status(retried, "completed")
    db.wait_status(dead, "dead")

    first, second = attempt_spans(span_dir, retried, 2)
    assert [
        first["attributes"]["pgworkerd.job.attempt"],
        second["attributes"]["pgworkerd.job.attempt"],
    ] == [1, 2]
    assert first["context"]["span_id"] != second["context"]["span_id"]
    for span in (first, second):
        assert len(linked_to(span, request_ids)) == 1
    assert first["status"]["status_code"] == "ERROR"
    assert "first attempt of job" in first["status"]["description"]
    assert first["attributes"]["pgworkerd.job.outcome"] == "failed"
    [event] = [e for e in first["events"] if e["name"] == "exception"]
    assert event["attributes"]["exception.type"].endswith("ValueError")
    assert "fails_once" in event["attributes"]["exception.stacktrace"]
    assert second["status"]["status_code"] == "OK"
    assert second["attributes"]["pgworkerd.job.outcome"] == "completed"

    [only] = attempt_spans(span_dir, dead, 1)
    assert only["status"]["status_code"] == "ERROR"
    assert "this handler always fails" in only["status"]["description"]


def test_attempt_parent_child_puts_every_attempt_in_the_enqueuers_trace(
    db: Db,
    daemons: Daemons,
    span_dir: Path,
    request_tracer: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = request_tracer
    start(daemons, attempt_parent="child")
    with provider.get_tracer("app").start_as_current_span("request") as request:
        job_id = db.enqueue("traced")
    trace_id, span_id = hex_ids(request)
    db.wait_status(job_id, "completed")
    [attempt] = attempt_spans(span_dir, job_id, 1)
    assert attempt["context"]["trace_id"] == trace_id
    assert attempt["parent_id"] == span_id
    assert attempt["links"] == []
    [work] = [s for s in spans(span_dir) if s["name"] == "handler work"]
    assert (work["context"]["trace_id"], work["parent_id"]) == (
        trace_id,
        attempt["context"]["span_id"],
    )


def test_a_follow_up_job_links_to_the_attempt_that_returned_it(
    db: Db, daemons: Daemons, span_dir: Path
) -> None:
    start(daemons)
    parent = db.enqueue("enqueues_a_follow_up")
    db.wait_status(parent, "completed")
    [(child, trace)] = [
        (r["id"], r["trace_context"])
        for r in db.rows("SELECT id, trace_context FROM {schema}.jobs WHERE id <> %s", (parent,))
    ]
    db.wait_status(child, "completed")
    [returned] = attempt_spans(span_dir, parent, 1)
    [followed] = attempt_spans(span_dir, child, 1)
    ids = (returned["context"]["trace_id"], returned["context"]["span_id"])
    assert trace["traceparent"].split("-")[1:3] == [ids[0][2:], ids[1][2:]]
    assert len(linked_to(followed, ids)) == 1


def test_a_job_enqueued_outside_a_trace_has_an_unlinked_attempt_span(
    db: Db, daemons: Daemons, span_dir: Path
) -> None:
    start(daemons)
    job_id = db.enqueue("traced")
    assert db.rows("SELECT trace_context FROM {schema}.jobs WHERE id = %s", (job_id,)) == [
        {"trace_context": None}
    ]
    db.wait_status(job_id, "completed")
    [attempt] = attempt_spans(span_dir, job_id, 1)
    assert attempt["links"] == [] and attempt["parent_id"] is None


def test_a_stopped_attempt_is_an_interrupted_error_and_a_killed_ones_outcome_stays_linked(
    db: Db,
    daemons: Daemons,
    span_dir: Path,
    request_tracer: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """A job stopped at its timeout (SIGTERM: JobInterrupted in the handler) ends its
    span, exported with the handler's. A child killed outright (SIGKILL) loses its
    unexported spans, as docs/operations/tracing.md says; the daemon's outcome write still
    links that attempt's outcome to the enqueuer."""
    provider, _ = request_tracer
    daemon = start(daemons)
    with provider.get_tracer("app").start_as_current_span("request") as request:
        timed_out = db.enqueue("sleeps", {"seconds": 120}, timeout=1, max_attempts=1)
        killed = db.enqueue("sleeps", {"seconds": 120}, max_attempts=1)
    request_ids = hex_ids(request)
    db.wait_status(timed_out, "dead")
    [stopped] = attempt_spans(span_dir, timed_out, 1)
    assert stopped["attributes"]["pgworkerd.job.outcome"] == "interrupted"
    assert stopped["status"]["status_code"] == "ERROR"
    [sleeping] = [
        s
        for s in spans(span_dir)
        if s["name"] == "sleeping" and s["parent_id"] == stopped["context"]["span_id"]
    ]
    # ended as JobInterrupted went through it (a BaseException: the SDK sets no status)
    assert sleeping["end_time"] is not None

    pid_file = span_dir / f"pid-{killed}"
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="its pid"))
    os.kill(pid, signal.SIGKILL)
    db.wait_status(killed, "dead")
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    links = [
        link
        for s in spans(span_dir)
        if s["name"] in ("pgworkerd claim", "pgworkerd record outcomes")
        for link in linked_to(s, request_ids)
        if link["attributes"]["pgworkerd.job.id"] == killed
        and "pgworkerd.job.outcome" in link["attributes"]
    ]
    assert [link["attributes"]["pgworkerd.job.outcome"] for link in links] == ["fail"]
    assert links[0]["attributes"]["pgworkerd.job.attempt"] == 1
    assert links[0]["attributes"]["pgworkerd.job.error"]
    assert [
        s
        for s in spans(span_dir)
        if s["attributes"].get("pgworkerd.job.id") == killed
        and s["name"].startswith("pgworkerd job ")
    ] == []  # lost with the child

"""Unit tier of pgworkerd.tracing (docs/operations/tracing.md): nothing of OpenTelemetry
is imported while tracing is off, and an attempt's span says its outcome as a trace
backend shows it (the SDK's InMemorySpanExporter; the real daemon and children are in
tests/acceptance/test_tracing.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pgworkerd import bounds, tracing
from pgworkerd.worker.protocol import Done, Failed, Interrupted, Job, decode, encode
from pgworkerd.worker.resources import Figures
from pgworkerd.worker.wire import FrameReader

OFF = """
import sys
from pgworkerd import client
from pgworkerd.config import Config
from pgworkerd.daemon import loop
from pgworkerd.worker import child, forkserver
assert client.ambient_trace() is None
assert "tracing" not in loop.child_settings(Config())
assert "pgworkerd.tracing" not in loop.forkserver_modules(Config())
assert loop.daemon_spans(Config(), "w") is None
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry", "pgworkerd.tracing")))
assert not loaded, loaded
"""


def test_with_tracing_off_nothing_of_opentelemetry_is_imported() -> None:
    """(In a fresh interpreter: this one has imported the SDK for the tests below.) The
    client, the daemon and the child modules, a client's look for the current span, and
    the daemon's and the fork server's settings with [tracing] off."""
    done = subprocess.run([sys.executable, "-c", OFF], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def job(trace: Any = None) -> Job:
    return Job(
        id=7,
        handler="h",
        target="m:f",
        queue="q",
        payload={},
        attempt=2,
        max_attempts=5,
        checkpoint=None,
        deadline=0.0,
        trace=trace,
    )


@pytest.fixture
def exported() -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = tracing.AttemptSpans(provider)
    yield spans, exporter
    provider.shutdown()


@pytest.mark.parametrize(
    ("outcome", "name", "status"),
    [
        (Done(7, {"ok": True}), "completed", StatusCode.OK),
        (
            Failed(7, "ValueError: no", "Traceback ...", exception_types=["builtins.ValueError"]),
            "failed",
            StatusCode.ERROR,
        ),
        (Failed(7, "Snooze: 5", snooze=5.0), "snoozed", StatusCode.OK),
        (Failed(7, "WaitFor: x", wait={"name": "x"}), "waiting", StatusCode.OK),
        (Failed(7, "GiveUp: bad input", give_up="bad input"), "gave up", StatusCode.ERROR),
        (Interrupted(7, "stopped by the daemon (SIGTERM)"), "interrupted", StatusCode.ERROR),
    ],
)
def test_an_attempts_span_says_its_outcome(
    exported: Any, outcome: Any, name: str, status: StatusCode
) -> None:
    spans, exporter = exported
    attempt = spans.start(job())
    spans.leave(attempt)
    spans.end(attempt, outcome, Figures(0.5, 0.25, 50 << 20, 40 << 20))
    [span] = exporter.get_finished_spans()
    assert span.name == "pgworkerd job h"
    assert span.attributes is not None
    assert span.attributes["pgworkerd.job.outcome"] == name
    assert span.attributes["pgworkerd.job.attempt"] == 2
    assert span.attributes["pgworkerd.job.peak_memory_bytes"] == 50 << 20
    assert span.status.status_code == status
    errors = [e for e in span.events if e.name == "exception"]
    assert len(errors) == (status == StatusCode.ERROR)


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        {"traceparent": "garbage"},
        {"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]},
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
    ],
)
def test_a_stored_context_that_does_not_read_gives_an_unlinked_span(
    exported: Any, stored: Any
) -> None:
    """The row is data (a direct INSERT skips enqueue's checks): what the propagator
    cannot read is no link, never an error in the child."""
    spans, exporter = exported
    attempt = spans.start(job(stored))
    spans.leave(attempt)
    spans.end(attempt, Done(7), None)
    [span] = exporter.get_finished_spans()
    assert list(span.links) == [] and span.parent is None


def test_the_job_message_carries_the_trace_to_the_child() -> None:
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    [frame] = FrameReader().feed(encode(job(trace)))
    assert decode(frame) == job(trace)
    assert "trace" not in FrameReader().feed(encode(job()))[0]  # left out when None


def test_the_python_bounds_accept_what_the_sdk_injects() -> None:
    assert (
        bounds.trace_problem(
            {
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03",
                "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            }
        )
        is None
    )

"""Tracing end to end through a real OTLP receiver (issue 27): [tracing] enabled with no
provider, so the daemon and each job child build the SDK's provider with the OTLP/HTTP
exporter from the OTEL_* variables, as a production host does; the spans travel over HTTP
as protobuf to oteltest's HttpSink (the OpenTelemetry Python project's test receiver, a
package of the registry: the Collector itself ships no Python package) and are read back
from what it received: the attempt linked to the enqueuing request, the handler's span
nested under the attempt, the daemon's claim, and the resource the variables named."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from typing import Any

import pytest
from daemon_harness import Daemons, Db, wait_for
from opentelemetry.sdk.trace import TracerProvider

sink_module = pytest.importorskip("oteltest.sink")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")

HANDLERS = {"traced": {"target": "tracehandlers:traced"}}


class Received:
    """What the receiver was sent (ExportTraceServiceRequest messages), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Any] = []

    def handle_trace(self, request: Any, headers: dict[str, str]) -> None:
        with self.lock:
            self.requests.append(request)

    def handle_metrics(self, request: Any, headers: dict[str, str]) -> None:
        pass

    def handle_logs(self, request: Any, headers: dict[str, str]) -> None:
        pass

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(the resource's attributes, the span) of every span received so far."""
        found = []
        with self.lock:
            requests = list(self.requests)
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    found += [(resource, span) for span in scope.spans]
        return found


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        kind = a.value.WhichOneof("value")
        out[a.key] = getattr(a.value, kind) if kind else None
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Any:
    received = Received()
    port = free_port()
    sink = sink_module.HttpSink(received, logging.getLogger("otlp-receiver"), port=port)
    sink.start()
    wait_for(lambda: sink.httpd is not None, what="the OTLP receiver")
    # what a host's unit would set; the daemon's children inherit them
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "reports-worker")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    yield received
    sink.stop()


def test_the_default_provider_exports_attempts_and_claims_over_otlp(
    db: Db, daemons: Daemons, receiver: Received
) -> None:
    app = TracerProvider()  # the application's own provider, as in a web app
    daemon = daemons.start(HANDLERS, tables={"tracing": {"enabled": True}})
    with app.get_tracer("app").start_as_current_span("POST /reports") as request:
        job_id = db.enqueue("traced", {"n": 1})
    request_trace = request.get_span_context().trace_id
    request_span = request.get_span_context().span_id
    db.wait_status(job_id, "completed")

    def attempt() -> tuple[dict[str, Any], Any] | None:
        return next(
            (
                (res, s)
                for res, s in receiver.spans()
                if s.name == "pgworkerd job traced"
                and attributes(s).get("pgworkerd.job.id") == job_id
            ),
            None,
        )

    resource, span = wait_for(attempt, what="the attempt's span at the receiver")
    assert resource["service.name"] == "reports-worker"
    assert resource["deployment.environment"] == "test"
    assert attributes(span)["pgworkerd.job.outcome"] == "completed"
    assert [
        (int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big"))
        for link in span.links
    ] == [(request_trace, request_span)]
    [work] = [s for _, s in receiver.spans() if s.name == "handler work"]
    assert work.trace_id == span.trace_id and work.parent_span_id == span.span_id

    # the daemon's spans: exported on its provider's schedule, or when it leaves
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    claim = wait_for(
        lambda: next(
            (
                s
                for _, s in receiver.spans()
                if s.name == "pgworkerd claim"
                and any(int.from_bytes(link.trace_id, "big") == request_trace for link in s.links)
            ),
            None,
        ),
        what="the daemon's claim span at the receiver",
    )
    assert attributes(claim)["pgworkerd.claim.jobs"] >= 1

"""OpenTelemetry traces (the `otel` extra; docs/operations/tracing.md).

- The enqueue carries the caller's W3C trace context into the job row (client.py asks
  `current_trace_context` only when the application has imported OpenTelemetry itself).
- Each attempt is a span started in the job's child around the handler, so the handler's
  own spans nest under it; it links to (or, with `[tracing] attempt_parent = "child"`, is
  a child of) the enqueuer's span, and carries the job's id, handler, queue, attempt,
  outcome and what the attempt cost.
- The daemon's claim and outcome writes are spans of the daemon, linked to the enqueuers'
  spans of the jobs they claimed or finished.

Every process builds its own TracerProvider (`[tracing] provider`, or the SDK's with the
OTLP exporter): the daemon once, each child after its fork, so that no exporter thread or
connection crosses a fork. A child ends an attempt's span before it reports the outcome
and flushes after, off the job's path. What a child killed mid-attempt (its lease ran
out, its memory limit, a crash) had not exported yet is lost with it: the attempt's own
span among it; the daemon's outcome span still links that attempt's outcome to the
enqueuer.

Imported only when used (the daemon and the fork server when [tracing] is enabled, the
client when the application has imported OpenTelemetry): with tracing off, nothing of
OpenTelemetry is imported by pgworkerd.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pgworkerd import bounds
from pgworkerd.version import __version__

TRACER_NAME = "pgworkerd"
# W3C trace context only, whatever propagators the application configured: the column
# holds traceparent and tracestate, which every OpenTelemetry SDK reads.
_W3C = TraceContextTextMapPropagator()
# The spans of a claim or an outcome write link to at most this many enqueuers (the SDK
# keeps 128 links by default); the count of jobs is an attribute either way.
MAX_LINKS = 100
# An error's text on a span or link: its first line, at most this many characters.
ERROR_CHARS = 500
# How long a child waits for its spans to be exported after an attempt, and before it
# exits (off the job's path: the outcome is sent by then).
FLUSH_MILLIS = 5000


def current_trace_context() -> dict[str, str] | None:
    """The current span's context as W3C headers ({"traceparent", "tracestate"}), None
    when no valid span is current (no tracer provider set, or outside any span). A
    tracestate enqueue would refuse (bounds.trace_problem) is left out, never the job."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    if "traceparent" not in carrier:
        return None
    carrier = {k: carrier[k] for k in ("traceparent", "tracestate") if k in carrier}
    if bounds.trace_problem(carrier) is not None:
        carrier.pop("tracestate", None)
    return carrier if bounds.trace_problem(carrier) is None else None


def enqueuer_context(trace_context: Any) -> trace.SpanContext | None:
    """The enqueuer's span context from a job's stored trace context, None when there is
    none or it does not read as one (the row is read as data: the W3C propagator parses
    it and ignores what it cannot read)."""
    if not isinstance(trace_context, dict):
        return None
    carrier = {k: v for k, v in trace_context.items() if isinstance(v, str)}
    found = trace.get_current_span(_W3C.extract(carrier)).get_span_context()
    return found if found.is_valid else None


def build_provider(target: str) -> Any:
    """The TracerProvider of this process: `target` ("module:function") called with no
    argument, or (target empty) the SDK's with a BatchSpanProcessor and the OTLP/HTTP
    exporter, both configured by the OTEL_* environment variables. Raises RuntimeError
    saying what is missing or wrong."""
    if target:
        module, _, function = target.partition(":")
        try:
            provider = getattr(importlib.import_module(module), function)()
        except Exception as exc:
            raise RuntimeError(f"[tracing] provider {target}: {type(exc).__name__}: {exc}") from exc
        if not hasattr(provider, "get_tracer"):
            raise RuntimeError(
                f"[tracing] provider {target} returned {type(provider).__name__}, not a "
                "TracerProvider"
            )
        return provider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise RuntimeError(
            "[tracing] enabled without a provider exports with OTLP over HTTP: install "
            "opentelemetry-exporter-otlp-proto-http, or name a provider function"
        ) from exc
    provider = TracerProvider(resource=default_resource())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


@functools.cache
def default_resource() -> Any:
    """The default provider's Resource: service.name "pgworkerd" unless OTEL_SERVICE_NAME
    or OTEL_RESOURCE_ATTRIBUTES say otherwise. Made once, in the fork server: the SDK's
    Resource.create reads the installed packages' entry points (40 to 150 ms measured,
    per call), which a child per job must not pay."""
    from opentelemetry.sdk.resources import Resource

    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    return Resource.create({} if named else {"service.name": "pgworkerd"})


def prepare_fork_server(tracing: dict[str, Any]) -> None:
    """In the fork server, before it forks any child: make what every child's provider
    shares (the default provider's Resource, when no provider function is named; a
    provider function should make its own at its module's import, which the fork server
    does once)."""
    if not tracing.get("provider"):
        default_resource()


def _flush(provider: Any) -> None:
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        try:
            flush(FLUSH_MILLIS)
        except Exception as exc:  # telemetry never costs a job
            print(f"pgworkerd: exporting spans failed: {exc!r}", file=sys.stderr)


def error_text(error: str) -> str:
    """An error as a span or link shows it: its first line, at most ERROR_CHARS."""
    return error.split("\n", 1)[0][:ERROR_CHARS]


# -- the child: one span per attempt ---------------------------------------------------


@dataclass
class Attempt:
    """An attempt's span while it runs, and the context token that makes it current."""

    span: Span
    token: object


class AttemptSpans:
    """A child's attempt spans. The provider becomes the process's global one unless the
    handler's modules set their own (then the handler's spans go through theirs, and both
    are flushed after each attempt)."""

    def __init__(self, provider: Any, attempt_parent: str = "link") -> None:
        self.provider = provider
        self.as_child = attempt_parent == "child"
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)
        self.tracer: Tracer = provider.get_tracer(TRACER_NAME, __version__)

    def start(self, job: Any) -> Attempt:
        """Start job `job`'s attempt span (a protocol.Job) and make it current."""
        enqueuer = enqueuer_context(job.trace)
        parent = otel_context.Context()  # a trace of its own (an attempt is no request's)
        links: list[Link] = []
        if enqueuer is not None:
            if self.as_child:
                parent = trace.set_span_in_context(trace.NonRecordingSpan(enqueuer))
            else:
                links.append(Link(enqueuer))
        span = self.tracer.start_span(
            f"pgworkerd job {job.handler}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "pgworkerd",
                "messaging.operation.type": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "pgworkerd.job.id": job.id,
                "pgworkerd.job.handler": job.handler,
                "pgworkerd.job.queue": job.queue,
                "pgworkerd.job.attempt": job.attempt,
                "pgworkerd.job.max_attempts": job.max_attempts,
            },
        )
        return Attempt(span, otel_context.attach(trace.set_span_in_context(span)))

    def leave(self, attempt: Attempt) -> None:
        """The handler has returned or raised: its span is no longer current."""
        otel_context.detach(attempt.token)  # type: ignore[arg-type]

    def end(self, attempt: Attempt, outcome: Any, figures: Any) -> None:
        """End the span with the attempt's outcome (a protocol report) and what it cost
        (resources.Figures, None if unmeasured)."""
        span = attempt.span
        kind = type(outcome).__name__
        if kind == "Done":
            name = "completed"
        elif kind == "Interrupted":
            name = "interrupted"
        elif getattr(outcome, "snooze", None) is not None:
            name = "snoozed"
        elif getattr(outcome, "wait", None) is not None:
            name = "waiting"
        elif getattr(outcome, "give_up", None) is not None:
            name = "gave up"
        else:
            name = "failed"
        span.set_attribute("pgworkerd.job.outcome", name)
        if figures is not None:
            span.set_attribute("pgworkerd.job.cpu_user_seconds", figures.cpu_user)
            span.set_attribute("pgworkerd.job.cpu_system_seconds", figures.cpu_system)
            span.set_attribute("pgworkerd.job.peak_memory_bytes", figures.peak_memory)
        if name in ("failed", "gave up", "interrupted"):
            error = str(getattr(outcome, "error", ""))
            types = getattr(outcome, "exception_types", None) or []
            span.add_event(
                "exception",
                {
                    "exception.type": types[0] if types else name,
                    "exception.message": error[:ERROR_CHARS],
                    "exception.stacktrace": str(getattr(outcome, "traceback", "")),
                },
            )
            span.set_status(Status(StatusCode.ERROR, error_text(error)))
        else:
            span.set_status(Status(StatusCode.OK))
        span.end()

    def flush(self) -> None:
        """Export what the attempt's spans left queued (ours, and the handler's provider's
        if it is another one)."""
        _flush(self.provider)
        handlers = trace.get_tracer_provider()
        if handlers is not self.provider:
            _flush(handlers)


def child_spans(settings: dict[str, Any]) -> AttemptSpans | None:
    """A child's AttemptSpans from the fork server's settings, None when tracing is off or
    the provider cannot be built (said on stderr: telemetry never costs a job)."""
    tracing = settings.get("tracing")
    if not isinstance(tracing, dict):
        return None
    try:
        provider = build_provider(str(tracing.get("provider") or ""))
    except RuntimeError as exc:
        print(f"pgworkerd child {os.getpid()}: tracing off: {exc}", file=sys.stderr)
        return None
    return AttemptSpans(provider, str(tracing.get("attempt_parent") or "link"))


# -- the daemon: its claim and outcome writes ------------------------------------------


class DaemonSpans:
    """The daemon's spans: each claim and each outcome write, linked to the enqueuers of
    the jobs concerned (at most MAX_LINKS of them)."""

    def __init__(self, provider: Any, worker_id: str) -> None:
        self.provider = provider
        self.worker_id = worker_id
        self.tracer: Tracer = provider.get_tracer(TRACER_NAME, __version__)

    @contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A span of the daemon's own (a root: the loop serves no request)."""
        with self.tracer.start_as_current_span(
            name,
            context=otel_context.Context(),
            kind=SpanKind.CLIENT,
            attributes={
                "db.system": "postgresql",
                "pgworkerd.worker": self.worker_id,
                **attributes,
            },
        ) as span:
            yield span

    def link_jobs(self, span: Span, jobs: Iterable[tuple[Any, dict[str, Any]]]) -> None:
        """Link `span` to each job's enqueuer: (job, the link's attributes) pairs, a job
        being anything with `id` and (perhaps) `trace`."""
        linked = 0
        for job, attributes in jobs:
            enqueuer = enqueuer_context(getattr(job, "trace", None))
            if enqueuer is None:
                continue
            if linked == MAX_LINKS:
                span.set_attribute("pgworkerd.links_left_out", True)
                return
            span.add_link(enqueuer, {"pgworkerd.job.id": job.id, **attributes})
            linked += 1

    def shutdown(self) -> None:
        """Export what is queued and stop (the daemon is leaving)."""
        _flush(self.provider)
        stop = getattr(self.provider, "shutdown", None)
        if stop is not None:
            try:
                stop()
            except Exception as exc:
                print(f"pgworkerd: stopping the tracer provider failed: {exc!r}", file=sys.stderr)

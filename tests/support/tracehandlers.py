"""Handlers and the tracer provider of the tracing tests (tests/acceptance/test_tracing.py).

`provider` is what [tracing] provider names: the daemon calls it once, each job child
after its fork. Its spans leave the process through the SDK's own ConsoleSpanExporter
(Span.to_json, one object a line) into $TRACEHANDLERS_DIR/spans-<pid>.jsonl, behind a
BatchSpanProcessor whose own schedule (a minute) is longer than any test: a child's
spans reach the file only through pgworkerd's flush at the attempt's end.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_tracer = trace.get_tracer("tracehandlers")  # the global provider's, whichever is set
# made once, at import (in the fork server): Resource.create costs tens of milliseconds
RESOURCE = Resource.create({"service.name": "pgworkerd-tests"})


def _line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def provider() -> TracerProvider:
    # open for the process's life (the exporter writes to it until the process ends)
    out = Path(os.environ["TRACEHANDLERS_DIR"], f"spans-{os.getpid()}.jsonl").open(  # noqa: SIM115
        "a", encoding="utf-8"
    )
    made = TracerProvider(resource=RESOURCE)
    made.add_span_processor(
        BatchSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=_line), schedule_delay_millis=60_000
        )
    )
    return made


def spans(directory: Path) -> list[dict[str, Any]]:
    """Every span the processes of a test exported so far (the JSON of Span.to_json)."""
    found = []
    for path in sorted(directory.glob("spans-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


# -- handlers ----------------------------------------------------------------------------


def traced(job: Any) -> dict[str, Any]:
    """A handler with a span of its own (it must nest under the attempt's)."""
    with _tracer.start_as_current_span("handler work") as span:
        span.set_attribute("work.job", job.id)
        total = sum(range(200_000))
    return {"total": total}


def fails_once(job: Any) -> str:
    """Fails its first attempt, completes its second."""
    if job.attempt == 1:
        raise ValueError(f"first attempt of job {job.id} fails")
    return "second time lucky"


def always_fails(job: Any) -> None:
    raise RuntimeError("this handler always fails")


def sleeps(job: Any) -> None:
    """Notes its pid ($TRACEHANDLERS_DIR/pid-<job id>), then sleeps inside a span of its
    own for payload["seconds"] (a timeout or a kill ends it first)."""
    Path(os.environ["TRACEHANDLERS_DIR"], f"pid-{job.id}").write_text(str(os.getpid()))
    with _tracer.start_as_current_span("sleeping"):
        time.sleep(float(job.payload["seconds"]))


def enqueues_a_follow_up(job: Any) -> Any:
    """Completes with a follow-up job (it carries this attempt's trace context)."""
    import pgworkerd

    return pgworkerd.Done("parent done", then=[pgworkerd.JobSpec("traced")])


async def traced_async(job: Any) -> int:
    """An async handler run side by side with others (concurrency): its own span must nest
    under its own job's attempt, never a neighbour's, while they overlap."""
    import asyncio

    with _tracer.start_as_current_span("async handler work") as span:
        span.set_attribute("work.job", job.id)
        await asyncio.sleep(0.3)  # its neighbours start and run meanwhile
    return job.id

"""The daemon's optional Prometheus endpoint (`[metrics] listen`).

`create(config)` returns a `Metrics` when an address is configured and a `NullMetrics`
otherwise; both have the same methods, so the daemon calls them unconditionally. The
null ones do nothing; the real ones update metrics in a private `CollectorRegistry` that
an HTTP server thread of the parent serves (the parent never forks: job children come
from the fork server, which is spawned, so a thread here is harmless).

No method raises into the daemon: an unexpected error is logged once and ignored. Only
`start()` raises, `MetricsError` (a ConfigError), when the address cannot be bound.
prometheus-client is imported only when the endpoint is enabled (an optional dependency:
`pip install 'pgworkerd[metrics]'`).

Bounded, because queue and handler names come from rows any enqueuer writes: the queue
gauge labels the queues this daemon serves, the `top_queues` biggest others and "other"
(the rest, summed); handler labels are configured handlers or "other"; label values are
printable (control characters escaped, length capped); a label set missing from the
latest count is dropped. The endpoint serves at most MAX_CONNECTIONS connections at once,
each with read/write timeouts and an overall deadline (boundedhttp.BoundedServer).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pgworkerd.config import ConfigError, MetricsConfig, split_listen
from pgworkerd.describe import printable
from pgworkerd.model import STATUSES
from pgworkerd.ops.boundedhttp import (
    CONNECTION_DEADLINE,
    IO_TIMEOUT,
    MAX_CONNECTIONS,
    BoundedServer,
)

log = logging.getLogger("pgworkerd")
F = TypeVar("F", bound=Callable[..., Any])

NAMESPACE = "pgworkerd"
# Enqueue (or due time) to start: from a few ms (warm child, NOTIFY) to hours of backlog.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    float("inf"),
)


# Peak memory of an attempt: 16 MiB to 64 GiB, doubling.
MEMORY_BUCKETS = (*(float(16 << 20 << i) for i in range(13)), float("inf"))


# The label for queues beyond the cap and for handlers this daemon does not run.
OTHER = "other"
# Longest label value exported: names are bounded at enqueue, but not tightly enough to
# keep a scrape small (a queue name of kilobytes times every status).
LABEL_MAX = 200


def label_value(text: str) -> str:
    """`text` as a label value a terminal or dashboard can show safely: characters that
    are not printable (control characters, ESC, bidi overrides, line separators...)
    written as Python escapes (\\x1b), the whole capped at LABEL_MAX characters.
    Prometheus's text format only escapes backslash, quote and newline itself."""
    if len(text) <= LABEL_MAX and text.isprintable():
        return text  # the common case, on every counter update: no copy
    escaped = printable(text[: LABEL_MAX + 1])
    return escaped if len(escaped) <= LABEL_MAX else escaped[: LABEL_MAX - 1] + "…"


class MetricsError(ConfigError):
    """The endpoint cannot be served (address in use, unknown host, library missing)."""


def _safe(method: F) -> F:
    """Never let a metrics problem reach the daemon's loop: log the first one, go on."""

    @functools.wraps(method)
    def wrapper(self: Metrics, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not self._error_logged:
                self._error_logged = True
                log.warning(
                    "metrics: %s failed (%s: %s); further metrics errors are not logged",
                    method.__name__,
                    type(exc).__name__,
                    exc,
                )
            return None

    return wrapper  # type: ignore[return-value]


def start_latency_seconds(
    run_at: datetime, created_at: datetime, now: float | None = None
) -> float:
    """Seconds from when a job became due (its run_at, or its enqueue if later) to `now`
    (time.time()); never negative (the database's clock and ours may differ a little)."""
    due = max(run_at, created_at).timestamp()
    return max(0.0, (time.time() if now is None else now) - due)


class NullMetrics:
    """Metrics disabled: every method is a no-op and no port is opened."""

    enabled = False
    port: int | None = None
    # What the queue-depth count asks for (see daemon.queuedepth.QueueDepthCounter).
    served_queues: tuple[str, ...] = ()
    top_queues = 0

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def set_worker(self, worker_id: str, version: str) -> None:
        pass

    def claimed(self, handler: str, *, rescued: bool = False) -> None:
        pass

    def outcome(self, handler: str, kind: str, ok: bool = True) -> None:
        pass

    def lease_renewed(self, count: int = 1) -> None:
        pass

    def lease_lost(self, handler: str) -> None:
        pass

    def set_in_flight(self, busy: int, slots: int | None = None) -> None:
        pass

    def set_draining(self, draining: bool) -> None:
        pass

    def queue_depth_due(self) -> bool:
        return False

    def set_queue_depth(self, rows: Iterable[tuple[str | None, str, int]]) -> None:
        pass

    def set_silent(self, jobs: int, daemons: int) -> None:
        pass

    def observe_job_start(
        self, run_at: datetime, created_at: datetime, handler: str | None = None
    ) -> None:
        pass

    def observe_attempt(
        self, handler: str, wall: float, cpu: float | None, peak_memory: int | None
    ) -> None:
        pass

    def set_memory(
        self, budget: int, held: int, expected: Mapping[str, int], refused: Mapping[str, int]
    ) -> None:
        pass


class Metrics(NullMetrics):
    """Metrics enabled: a private registry served over HTTP once `start()` ran."""

    enabled = True

    # The endpoint's bounds (see boundedhttp), per instance so a test can shorten them.
    max_connections = MAX_CONNECTIONS
    io_timeout = IO_TIMEOUT
    connection_deadline = CONNECTION_DEADLINE

    def __init__(
        self,
        config: MetricsConfig,
        *,
        queues: Iterable[str] = (),
        handlers: Iterable[str] | None = None,
    ) -> None:
        """`queues`: the queues this daemon serves, always labelled (at 0 when empty).
        `handlers`: the configured handlers, the only handler labels (any other name is
        "other"); None labels every name (still made printable)."""
        try:
            import prometheus_client as prom
            from prometheus_client.core import GaugeMetricFamily
        except ImportError:
            raise MetricsError(
                f"metrics.listen = {config.listen!r}: the Prometheus endpoint needs "
                "prometheus-client, which is not installed (pip install 'pgworkerd[metrics]')"
            ) from None
        self.config = config
        try:
            self.host, self.port = split_listen(config.listen)
        except ValueError as exc:
            raise MetricsError(f"metrics.listen: {exc}") from None
        self._error_logged = False
        self._server: Any = None
        self._thread: Any = None
        self.served_queues = tuple(queues)
        self.top_queues = config.top_queues
        self._served_labels = {label_value(q) for q in self.served_queues}
        self._handlers = None if handlers is None else frozenset(handlers)
        self._depth_at = 0.0  # monotonic time of the last queue-depth refresh
        # The last snapshot: ({(queue, status): jobs}, queues exported), swapped whole.
        self._depth: tuple[dict[tuple[str, str], int], set[str]] = (
            {},
            self._served_labels | {OTHER},
        )
        self.registry = registry = prom.CollectorRegistry(auto_describe=True)
        ns = NAMESPACE

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Counter(name, doc, labels, namespace=ns, registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Gauge(name, doc, labels, namespace=ns, registry=registry)

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
        ) -> Any:
            return prom.Histogram(
                name, doc, labels, namespace=ns, registry=registry, buckets=buckets
            )

        self.info = gauge(
            "daemon_info",
            "This daemon's registry id and version (always 1).",
            ("worker_id", "version"),
        )
        self.claims = counter("jobs_claimed", "Jobs claimed by this daemon.", ("handler",))
        self.rescues = counter(
            "jobs_rescued",
            "Jobs claimed after another daemon's lease on them expired.",
            ("handler",),
        )
        self.completions = counter("jobs_completed", "Completions recorded.", ("handler",))
        self.failures = counter(
            "jobs_failed", "Failed attempts recorded (exception, crash, timeout...).", ("handler",)
        )
        self.releases = counter(
            "jobs_released", "Jobs handed back unfinished (drain, stop).", ("handler",)
        )
        self.cancellations = counter(
            "jobs_cancelled", "Running jobs cancelled on request.", ("handler",)
        )
        self.refusals = counter(
            "jobs_refused",
            "Claimed jobs finished as dead at once: their row could not be loaded or "
            "handed to a child (see last_error).",
            ("handler",),
        )
        # handler-controlled outcomes (pgworkerd.Snooze, GiveUp, no_retry)
        self.snoozes = counter(
            "jobs_snoozed", "Jobs a handler snoozed (attempt not counted).", ("handler",)
        )
        self.give_ups = counter(
            "jobs_given_up",
            "Jobs ended as dead at once by their handler (GiveUp, or a no_retry exception).",
            ("handler",),
        )
        self.waits = counter(
            "jobs_suspended",
            "Jobs a handler suspended until a signal or a timeout (WaitFor; attempt not counted).",
            ("handler",),
        )
        self.fenced_off = counter(
            "outcomes_fenced",
            "Outcomes rejected because the lease was lost and the job re-claimed.",
            ("handler", "outcome"),
        )
        self.renewals = counter("lease_renewals", "Leases renewed.")
        self.losses = counter(
            "lease_losses", "Jobs stopped because their lease was lost.", ("handler",)
        )
        self.in_flight = gauge("jobs_in_flight", "Jobs this daemon holds (claimed or running).")
        self.slots = gauge("slots", "Jobs this daemon may run at once.")
        self.draining = gauge(
            "draining", "1 while this daemon takes no new jobs (drain requested or stopping)."
        )
        # Fleet-wide, read with the queue depth (queue_depth_interval): every daemon exports
        # the same count (aggregate with max, not sum). No labels: daemon ids change at
        # every start, and `pgworkerd status` names the daemons and jobs.
        self.silent_jobs = gauge(
            "silent_daemon_jobs",
            "Running jobs (fleet-wide) whose daemon is silent: no registry heartbeat for"
            " over twice its interval. Left to their leases (pgworkerd explain: daemon_silent).",
        )
        self.silent_daemons = gauge(
            "silent_daemons",
            "Silent daemons (fleet-wide) that hold running jobs.",
        )
        # Admission by memory ([worker] memory_budget; daemon.admission): this daemon's.
        self.memory_budget = gauge("memory_budget_bytes", "This daemon's [worker] memory_budget.")
        self.memory_held = gauge(
            "memory_held_bytes",
            "What the jobs running here are expected to use (each its handler's expectation).",
        )
        self.memory_expected = gauge(
            "memory_expected_bytes",
            "What one job of the handler is expected to use (recent peak, else its estimate).",
            ("handler",),
        )
        self.memory_refused = gauge(
            "memory_admission_refused_slots",
            "Free slots admission did not offer the handler's jobs at the last claim: their"
            " expected memory did not fit what is free of the budget.",
            ("handler",),
        )
        self.start_latency = histogram(
            "job_start_latency_seconds",
            "From when a job was due (enqueued, or its run_at) to its start in a child.",
            LATENCY_BUCKETS,
        )
        # The same per handler: the Charts page's wait time, in Prometheus (the page's
        # own, from the rollup, ends at the claim; this one at the start in a child).
        self.wait = histogram(
            "job_wait_seconds",
            "From when a job was due (enqueued, or its run_at) to its start in a child,"
            " per handler.",
            LATENCY_BUCKETS,
            ("handler",),
        )
        # What each attempt cost (its accounting, migration 0012), per handler.
        self.attempt_duration = histogram(
            "attempt_duration_seconds",
            "Wall time of an attempt, from its claim to its end.",
            LATENCY_BUCKETS,
            ("handler",),
        )
        self.attempt_cpu = histogram(
            "attempt_cpu_seconds",
            "CPU time (user and system) of an attempt's whole process tree.",
            LATENCY_BUCKETS,
            ("handler",),
        )
        self.attempt_memory = histogram(
            "attempt_peak_memory_bytes",
            "Peak resident memory of an attempt's whole process tree.",
            MEMORY_BUCKETS,
            ("handler",),
        )

        outer = self

        class _QueueDepth:
            """Exported from the last snapshot, swapped whole: a scrape never sees a
            half-updated set of series."""

            def describe(self) -> list[Any]:
                return []

            def collect(self) -> Iterable[Any]:
                family = GaugeMetricFamily(
                    f"{ns}_queue_jobs",
                    "Jobs per queue and status (refreshed every queue_depth_interval): "
                    'the served queues, the top_queues biggest others, the rest as "other".',
                    labels=("queue", "status"),
                )
                # Every job status is exported (0 included) for every queue exported, so
                # a series does not vanish when its count drops to zero.
                depth, queues = outer._depth
                statuses = sorted({*STATUSES, *(s for _, s in depth)})
                for queue in sorted(queues):
                    for status in statuses:
                        family.add_metric((queue, status), depth.get((queue, status), 0))
                yield family

        registry.register(_QueueDepth())

    # -- the endpoint ----------------------------------------------------------------------

    def start(self) -> None:
        """Serve /metrics; raises MetricsError when the address cannot be bound.

        As prometheus-client's start_http_server (its WSGI app on a wsgiref server in a
        daemon thread), but on a BoundedServer: that one has no timeouts and no cap."""
        from prometheus_client import make_wsgi_app

        host = self.host or "0.0.0.0"
        try:
            # The family of the address (an IPv6 one needs AF_INET6), as prometheus does.
            family, _, _, _, sockaddr = socket.getaddrinfo(
                host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            server = BoundedServer(
                (str(sockaddr[0]), self.port or 0),
                family,
                max_connections=self.max_connections,
                io_timeout=self.io_timeout,
                deadline=self.connection_deadline,
            )
        except OSError as exc:  # EADDRINUSE, EACCES, unknown host (gaierror)...
            raise MetricsError(
                f"metrics.listen = {self.config.listen!r}: cannot serve the Prometheus "
                f"endpoint on {host}:{self.port}: {exc.strerror or exc}"
            ) from None
        server.set_app(make_wsgi_app(self.registry))
        self._server = server
        self.port = server.server_address[1]  # the real one when port 0 was asked
        self._thread = threading.Thread(
            target=server.serve_forever, name="pgworkerd-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics: serving Prometheus metrics on http://%s/metrics", self.address)

    @property
    def address(self) -> str:
        host = self.host or "0.0.0.0"
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            try:
                server.shutdown()
                server.server_close()
            except Exception as exc:  # at exit: nothing to do about it
                log.debug("metrics: stopping the endpoint: %s", exc)
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # -- updates from the daemon -----------------------------------------------------------

    def _handler(self, name: str) -> str:
        """The handler label: a configured handler's name, else "other" (a row can name
        any handler; the label set must not grow with them)."""
        if self._handlers is not None and name not in self._handlers:
            return OTHER
        return label_value(name)

    @_safe
    def set_worker(self, worker_id: str, version: str) -> None:
        self.info.clear()
        self.info.labels(label_value(worker_id), label_value(version)).set(1)

    @_safe
    def claimed(self, handler: str, *, rescued: bool = False) -> None:
        handler = self._handler(handler)
        self.claims.labels(handler).inc()
        if rescued:
            self.rescues.labels(handler).inc()

    @_safe
    def outcome(self, handler: str, kind: str, ok: bool = True) -> None:
        """One outcome written: kind complete, fail, release, cancel, bury (a job refused
        at the claim), snooze or give up (the handler's choice); ok False when the
        write was fenced off (the lease was lost and the job re-claimed)."""
        handler = self._handler(handler)
        if not ok:
            self.fenced_off.labels(handler, kind).inc()
        elif kind == "complete":
            self.completions.labels(handler).inc()
        elif kind == "fail":
            self.failures.labels(handler).inc()
        elif kind == "release":
            self.releases.labels(handler).inc()
        elif kind == "cancel":
            self.cancellations.labels(handler).inc()
        elif kind == "bury":
            self.refusals.labels(handler).inc()
        elif kind == "snooze":
            self.snoozes.labels(handler).inc()
        elif kind == "give up":
            self.give_ups.labels(handler).inc()
        elif kind == "wait":
            self.waits.labels(handler).inc()

    @_safe
    def set_memory(
        self, budget: int, held: int, expected: Mapping[str, int], refused: Mapping[str, int]
    ) -> None:
        """Admission by memory: the budget, what the running jobs hold, and per configured
        handler its expectation and the slots refused at the last claim (bytes)."""
        self.memory_budget.set(budget)
        self.memory_held.set(held)
        for name, each in expected.items():  # configured handlers only: bounded labels
            self.memory_expected.labels(self._handler(name)).set(each)
        for name, slots in refused.items():
            self.memory_refused.labels(self._handler(name)).set(slots)

    @_safe
    def lease_renewed(self, count: int = 1) -> None:
        if count > 0:
            self.renewals.inc(count)

    @_safe
    def lease_lost(self, handler: str) -> None:
        self.losses.labels(self._handler(handler)).inc()

    @_safe
    def set_in_flight(self, busy: int, slots: int | None = None) -> None:
        self.in_flight.set(busy)
        if slots is not None:
            self.slots.set(slots)

    @_safe
    def set_draining(self, draining: bool) -> None:
        self.draining.set(1 if draining else 0)

    def queue_depth_due(self) -> bool:
        """Whether the daemon should count the jobs again (queue_depth_interval passed)."""
        return time.monotonic() >= self._depth_at + self.config.queue_depth_interval

    @_safe
    def set_queue_depth(self, rows: Iterable[tuple[str | None, str, int]]) -> None:
        """Rows of (queue, status, jobs), as queue.admin.counts_capped returns them (queue
        None: the other queues, summed): a full snapshot. A status missing from it counts
        0; a queue missing from it is no longer exported, unless this daemon serves it.
        Rows for more queues than the cap (plain per-queue counts) are folded the same
        way here, so the series stay bounded whoever calls this."""
        self._depth_at = time.monotonic()
        per_queue: dict[str, dict[str, int]] = {}
        for queue, status, jobs_ in rows:
            # Names that differ only in escaped or cut characters share a label: summed.
            label = OTHER if queue is None else label_value(str(queue))
            counts = per_queue.setdefault(label, {})
            status = label_value(str(status))
            counts[status] = counts.get(status, 0) + int(jobs_)
        others = [q for q in per_queue if q not in self._served_labels and q != OTHER]
        if len(others) > self.top_queues:
            others.sort(key=lambda q: (-sum(per_queue[q].values()), q))
            rest = per_queue.setdefault(OTHER, {})
            for queue in others[self.top_queues :]:
                for status, n in per_queue.pop(queue).items():
                    rest[status] = rest.get(status, 0) + n
        depth = {(q, st): n for q, counts in per_queue.items() for st, n in counts.items()}
        # Served queues and "other" are always exported (at 0 when empty); any other
        # queue only while it is in the latest count, so stale series disappear.
        self._depth = (depth, self._served_labels | {OTHER} | set(per_queue))

    @_safe
    def set_silent(self, jobs: int, daemons: int) -> None:
        """The fleet's running jobs whose daemon is silent, and their daemons
        (views.silent_jobs)."""
        self.silent_jobs.set(max(0, jobs))
        self.silent_daemons.set(max(0, daemons))

    @_safe
    def observe_job_start(
        self, run_at: datetime, created_at: datetime, handler: str | None = None
    ) -> None:
        seconds = start_latency_seconds(run_at, created_at)
        self.start_latency.observe(seconds)
        if handler is not None:
            self.wait.labels(self._handler(handler)).observe(seconds)

    @_safe
    def observe_attempt(
        self, handler: str, wall: float, cpu: float | None, peak_memory: int | None
    ) -> None:
        handler = self._handler(handler)
        self.attempt_duration.labels(handler).observe(max(0.0, wall))
        if cpu is not None:
            self.attempt_cpu.labels(handler).observe(max(0.0, cpu))
        if peak_memory is not None:
            self.attempt_memory.labels(handler).observe(max(0, peak_memory))


def create(
    config: MetricsConfig, *, queues: Iterable[str] = (), handlers: Iterable[str] | None = None
) -> NullMetrics:
    """A Metrics for an enabled config, else a NullMetrics (raises MetricsError when
    prometheus-client is missing). Call start() on the result to serve it. `queues` (the
    served ones) and `handlers` (the configured ones): see Metrics."""
    if not config.enabled:
        return NullMetrics()
    return Metrics(config, queues=queues, handlers=handlers)

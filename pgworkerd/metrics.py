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
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from pgworkerd import jobs
from pgworkerd.config import ConfigError, MetricsConfig, split_listen

log = logging.getLogger("pgworkerd")
F = TypeVar("F", bound=Callable[..., Any])

NAMESPACE = "pgworkerd"
# Job statuses whose depth is always exported (0 included) for every queue seen, so a
# series does not vanish when its count drops to zero.
STATUSES = jobs.STATUSES
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

    def completed(self, handler: str) -> None:
        pass

    def failed(self, handler: str) -> None:
        pass

    def fenced(self, handler: str, kind: str) -> None:
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

    def set_queue_depth(self, rows: Iterable[tuple[str, str, int]]) -> None:
        pass

    def observe_start_latency(self, seconds: float) -> None:
        pass

    def observe_job_start(self, run_at: datetime, created_at: datetime) -> None:
        pass


class Metrics(NullMetrics):
    """Metrics enabled: a private registry served over HTTP once `start()` ran."""

    enabled = True

    def __init__(self, config: MetricsConfig) -> None:
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
        self._depth_at = 0.0  # monotonic time of the last queue-depth refresh
        self._depth: dict[tuple[str, str], int] = {}
        self._depth_queues: set[str] = set()
        self.registry = registry = prom.CollectorRegistry(auto_describe=True)
        ns = NAMESPACE

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Counter(name, doc, labels, namespace=ns, registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Gauge(name, doc, labels, namespace=ns, registry=registry)

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
        self.start_latency = prom.Histogram(
            "job_start_latency_seconds",
            "From when a job was due (enqueued, or its run_at) to its start in a child.",
            namespace=ns,
            registry=registry,
            buckets=LATENCY_BUCKETS,
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
                    "Jobs per queue and status (refreshed every queue_depth_interval).",
                    labels=("queue", "status"),
                )
                depth, queues = outer._depth, outer._depth_queues
                statuses = sorted({*STATUSES, *(s for _, s in depth)})
                for queue in sorted(queues):
                    for status in statuses:
                        family.add_metric((queue, status), depth.get((queue, status), 0))
                yield family

        registry.register(_QueueDepth())  # type: ignore[arg-type]

    # -- the endpoint ----------------------------------------------------------------------

    def start(self) -> None:
        """Serve /metrics; raises MetricsError when the address cannot be bound."""
        from prometheus_client import start_http_server

        host = self.host or "0.0.0.0"
        try:
            started = start_http_server(self.port, addr=host, registry=self.registry)
        except OSError as exc:  # EADDRINUSE, EACCES, unknown host (gaierror)...
            raise MetricsError(
                f"metrics.listen = {self.config.listen!r}: cannot serve the Prometheus "
                f"endpoint on {host}:{self.port}: {exc.strerror or exc}"
            ) from None
        if isinstance(started, tuple):  # prometheus-client >= 0.17 returns them
            self._server, self._thread = started
            self.port = self._server.server_address[1]  # the real one when port 0 was asked
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

    @_safe
    def set_worker(self, worker_id: str, version: str) -> None:
        self.info.clear()
        self.info.labels(worker_id, version).set(1)

    @_safe
    def claimed(self, handler: str, *, rescued: bool = False) -> None:
        self.claims.labels(handler).inc()
        if rescued:
            self.rescues.labels(handler).inc()

    @_safe
    def outcome(self, handler: str, kind: str, ok: bool = True) -> None:
        """One outcome written: kind complete, fail, release or cancel; ok False when the
        write was fenced off (the lease was lost and the job re-claimed)."""
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

    def completed(self, handler: str) -> None:
        self.outcome(handler, "complete")

    def failed(self, handler: str) -> None:
        self.outcome(handler, "fail")

    def fenced(self, handler: str, kind: str) -> None:
        self.outcome(handler, kind, ok=False)

    @_safe
    def lease_renewed(self, count: int = 1) -> None:
        if count > 0:
            self.renewals.inc(count)

    @_safe
    def lease_lost(self, handler: str) -> None:
        self.losses.labels(handler).inc()

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
    def set_queue_depth(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Rows of (queue, status, jobs), as jobs.counts() returns them: a full snapshot
        (a status missing from it counts 0)."""
        self._depth_at = time.monotonic()
        depth = {(str(q), str(s)): int(n) for q, s, n in rows}
        # Queues once seen stay exported (at 0), so their series do not vanish.
        self._depth_queues = self._depth_queues | {q for q, _ in depth}
        self._depth = depth

    @_safe
    def observe_start_latency(self, seconds: float) -> None:
        self.start_latency.observe(max(0.0, seconds))

    @_safe
    def observe_job_start(self, run_at: datetime, created_at: datetime) -> None:
        self.start_latency.observe(start_latency_seconds(run_at, created_at))


def create(config: MetricsConfig) -> NullMetrics:
    """A Metrics for an enabled config, else a NullMetrics (raises MetricsError when
    prometheus-client is missing). Call start() on the result to serve it."""
    return Metrics(config) if config.enabled else NullMetrics()

"""The whole configuration (`Config`) and the list of its tables, in the order the file,
the reference and `check-config` show them."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from pgworkerd.config.handlers import HandlerConfig, ScheduleConfig
from pgworkerd.config.spec import Table
from pgworkerd.config.tables import (
    DatabaseConfig,
    LoggingConfig,
    LogsConfig,
    MetricsConfig,
    RetentionConfig,
    TracingConfig,
    WebConfig,
    WorkerConfig,
)


@dataclass(frozen=True)
class Config:
    path: str = "<defaults>"
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    handlers: dict[str, HandlerConfig] = field(default_factory=dict)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    schedules: dict[str, ScheduleConfig] = field(default_factory=dict)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    web: WebConfig = field(default_factory=WebConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    @property
    def queues(self) -> tuple[str, ...]:
        if self.worker.queues:
            return self.worker.queues
        return tuple(sorted({q for h in self.handlers.values() for q in h.queues or (h.queue,)}))

    def lease_for(self, handler: HandlerConfig) -> float:
        return handler.lease if handler.lease is not None else self.worker.lease

    def stop_grace_for(self, handler: HandlerConfig) -> float:
        """How long a job of `handler` has to stop when handed back (without --grace)."""
        return handler.stop_grace if handler.stop_grace is not None else self.worker.stop_grace

    def worker_name(self) -> str:
        return self.worker.name or socket.gethostname()


# Every table of the file; the attribute of Config each fills is its name.
TABLES: list[Table] = [
    Table("database", DatabaseConfig, "Where the queue lives and how long each wait may be."),
    Table("worker", WorkerConfig, "This daemon: its slots, leases, children and retries."),
    Table("logging", LoggingConfig, "The daemon's own log lines."),
    Table("metrics", MetricsConfig, "The Prometheus endpoint."),
    Table(
        "handlers",
        HandlerConfig,
        "One table per handler: [handlers.NAME], NAME being what jobs name in their "
        "`handler`. Only configured handlers run; a job naming any other handler stays "
        "pending.",
        named=True,
        example="sleep_with_progress",
        extra='[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n',
    ),
    Table(
        "schedules",
        ScheduleConfig,
        "Periodic jobs. One table per schedule: [schedules.NAME] (NAME checked like a "
        "handler name). Each tick enqueues one job across the whole fleet, however many "
        'daemons declare the schedule (README "Periodic jobs"). Exactly one of `cron` and '
        "`every`. What a tick could never enqueue is refused when the config is read.",
        named=True,
        example="nightly_report",
        commented=True,
    ),
    Table(
        "retention",
        RetentionConfig,
        "The fleet deletes its own finished jobs (and their history) once they are older "
        'than this, per final status: a duration, or "off" (or 0) to keep them forever. One '
        "daemon at a time does it (an advisory lock), in small batches, oldest first. The "
        "daemon role needs EXECUTE on prune_finished_v2 (roles.sql), not DELETE. See README "
        '"Retention".',
    ),
    Table(
        "logs",
        LogsConfig,
        'What jobs print, captured per attempt (README "Job logs").',
    ),
    Table(
        "web",
        WebConfig,
        "`pgworkerd web`, the dashboard (pip install 'pgworkerd[web]'; README \"Web dashboard\").",
    ),
    Table(
        "tracing",
        TracingConfig,
        "OpenTelemetry traces from enqueue to every attempt (pip install 'pgworkerd[otel]'; "
        "docs/operations/tracing.md).",
    ),
]

"""The single tables of the file ([database], [worker], [logging], [metrics], [retention],
[logs], [web]): one frozen dataclass each, every key declared once with its default, check
and help (`key(...)`). config.example.toml and docs/reference/configuration.md are
generated from these declarations (`python -m pgworkerd.config.docs --write`)."""

from __future__ import annotations

from dataclasses import dataclass

from pgworkerd.config import checks, webusers
from pgworkerd.config.spec import key
from pgworkerd.masking import mask_dsn
from pgworkerd.names import DEFAULT_SCHEMA


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str = key(
        "",
        check=checks.string,
        shown=mask_dsn,
        help="libpq connection string or URL. Empty: libpq's environment (PGHOST, PGUSER, "
        "PGPASSWORD, PGDATABASE, ~/.pgpass, PGSERVICE) and, where that says nothing, "
        "libpq's defaults (the local socket, port 5432): `run` connects there and retries "
        "until it answers; it never starts the demo. Prefer ~/.pgpass or PGPASSWORD over a "
        "password here; pgworkerd never prints it either way. A file holding a password "
        "should be mode 0600 (or 0640 with the daemon's group): pgworkerd warns when others "
        "can read it. Job children never see these settings, nor any PG* variable.",
    )
    listen_dsn: str = key(
        "",
        check=checks.string,
        shown=mask_dsn,
        help="A direct connection (not through PgBouncer) for LISTEN; empty: the same as dsn.",
    )
    schema: str = key(
        DEFAULT_SCHEMA,
        check=checks.schema_name,
        help="PostgreSQL schema holding pgworkerd's tables (create it with `pgworkerd migrate`).",
    )
    connect_timeout: float = key(
        5.0,
        check=checks.positive_duration,
        help="How long connecting may take. Every database wait is bounded: connecting, an "
        "idle or silent peer, unacknowledged sends, and each statement.",
    )
    keepalives_idle: float = key(
        5.0,
        check=checks.positive_duration,
        help="TCP keepalives start after this long without traffic, so a silent peer is noticed.",
    )
    tcp_user_timeout: float = key(
        10.0,
        check=checks.millis_duration,
        help="How long sent data may stay unacknowledged before the connection is given up.",
    )
    statement_timeout: float = key(
        10.0,
        check=checks.millis_duration,
        help="Each statement of the daemon is cancelled after this long.",
    )
    prepared_statements: bool = key(
        True,
        check=checks.boolean,
        help="Server-side prepared statements on the daemon's connection: the claim is "
        "planned once, not on every call. Set false when dsn goes through PgBouncer older "
        "than 1.21 in transaction (or statement) pooling mode, which cannot route prepared "
        "statements; PgBouncer >= 1.21 with max_prepared_statements > 0, session mode and "
        "direct connections are fine with true.",
    )


@dataclass(frozen=True)
class WorkerConfig:
    name: str = key(
        "",
        check=checks.string,
        help="Prefix of this daemon's id in the registry (id = name:pid:random). Empty: the "
        "host name.",
    )
    slots: int = key(
        4, check=checks.integer(1), help="Jobs run at once on this host (one child process each)."
    )
    queues: tuple[str, ...] = key(
        (),
        check=checks.queue_names,
        help="Queues served. Empty: the queues named by the handlers.",
    )
    lease: float = key(
        60.0,
        check=checks.positive_duration,
        help="How long a claimed job stays ours without renewal. Short: a dead host's jobs "
        "are rescued fast. Long: database outages and restarts up to this long stop nothing "
        "that runs.",
    )
    renew_interval: float = key(
        10.0,
        check=checks.positive_duration,
        help="How often the parent renews every lease of this host (one statement); at most "
        "a third of every lease, so a lease survives two missed renewals.",
    )
    poll_interval: float = key(
        5.0,
        check=checks.positive_duration,
        help="Fallback claim poll; NOTIFY wakes one daemon at once when jobs are enqueued. "
        "While LISTEN works the fleet shares it: with N daemons each polls every "
        "poll_interval x N/10 (at most 10 minutes), so the fleet polls about 10 times per "
        'poll_interval (README "Capacity"). Without LISTEN each daemon polls every '
        "poll_interval.",
    )
    drain_timeout: float = key(
        300.0,
        check=checks.duration,
        help="On SIGTERM/SIGINT: how long running jobs may take to finish before they are "
        "stopped and handed back (released, the attempt not counted). (`pgworkerd drain` "
        "without --hand-back waits for jobs however long they take.)",
    )
    kill_grace: float = key(
        10.0,
        check=checks.duration,
        help="Between SIGTERM and SIGKILL when a child must stop (timeout, cancel, drain "
        "timeout, the end of a hand-back's grace).",
    )
    # 30 s: a handler that checkpoints every 10 s saves one (README "Handlers") and a
    # deploy still ends well inside systemd's default 90 s stop timeout.
    stop_grace: float = key(
        30.0,
        check=checks.stop_grace,
        help="`pgworkerd drain --hand-back` without --grace: how long a running job has, "
        "once asked to stop (job.stop_requested), to save a checkpoint and return before it "
        "is handed back (a handler's own stop_grace wins).",
    )
    max_jobs_per_child: int = key(
        1,
        check=checks.integer(1),
        help="Jobs a child runs before it is replaced; 1 = a fresh process for every job.",
    )
    prefetch: int = key(
        0,
        check=checks.integer(0, 1000),
        help="Claimed jobs held ready beyond the slots, each handed to a child the moment "
        "one is free, with no claim in between: for many short jobs (a claim is a round "
        "trip to the database, which a child running jobs of a millisecond spends idle). A "
        "held job is this daemon's (running in the database, its lease renewed, counted by "
        "max_running) until it starts or is handed back (a drain hands it back at once); "
        "claims wait until half of it is free, and while more jobs wait in the database a "
        "finished job's completion waits up to 10 ms for the next claim, which writes it "
        "in its own transaction (one commit for both). 0: claim only for free slots.",
    )
    warm_children: int = key(
        2,
        check=checks.integer(0),
        help="Idle children kept forked and ready, so a claimed job starts without waiting "
        "for a fork.",
    )
    backoff: float = key(
        10.0,
        check=checks.duration,
        help="Retry backoff after a failed attempt: backoff * 2^(attempt-1), +-25 % jitter, "
        "capped at backoff_max.",
    )
    backoff_max: float = key(
        3600.0,
        check=checks.duration,
        help="The longest retry backoff; not shorter than backoff.",
    )
    memory_limit: int | None = key(
        None,
        check=checks.size,
        example=2 << 30,
        help="Memory limit of each job's whole process tree (the child and everything it "
        "starts), unless its handler sets its own. Sampled every 0.25 s; a job over it is "
        'stopped and its attempt fails with "memory limit 2 GiB exceeded (peak 2.1 GiB)". '
        "Unset: no limit.",
    )
    max_child_memory: int | None = key(
        None,
        check=checks.size,
        example=1 << 30,
        help="With max_jobs_per_child > 1: a child whose own resident memory is past this "
        "after a job (a leak in a long-lived child) is replaced by a fresh one. Unset: never.",
    )
    memory_budget: int | None = key(
        None,
        check=checks.size,
        example=8 << 30,
        help="Admission by measured memory (docs/guide/memory-admission.md): this host "
        "claims a handler's job only while the jobs it runs are expected to fit in this "
        "budget, each expected to use its handler's recent peak (the 95th percentile of its "
        "last 50 measured attempts, at least 16MiB and at most its memory_limit; its "
        "memory_estimate until 5 are measured). Unset: no admission by memory.",
    )
    job_uids: tuple[int, int] | None = key(
        None,
        check=checks.uid_range,
        example=(61000, 61063),
        shown=checks.uid_range_text,  # as written in the file
        help="Run each job child as its own uid from this range, like systemd's DynamicUser "
        '(README "Per-job uids"): one job cannot read, write or signal another job, the '
        "daemon or this file. Needs a root daemon (with CAP_SETUID, CAP_SETGID, CAP_CHOWN, "
        "CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_KILL), this file unreadable by others, and at "
        "least slots + warm_children uids that no account or group uses. Unset: jobs run "
        "as the daemon's uid.",
    )
    # applies after a restart
    job_cgroups: str = key(
        "auto",
        check=checks.choice("auto", "off", "require"),
        help='One cgroup per attempt (README "Per-attempt cgroups"): "auto" where the daemon '
        "runs in a cgroup v2 directory delegated to it (systemd's Delegate=yes: "
        'dropin-job-cgroups.conf), "off", or "require" (refuse to start without one). Each '
        "attempt's processes are then killed at once when it ends, and memory.max holds its "
        "memory limit where the memory controller is delegated.",
    )


@dataclass(frozen=True)
class LoggingConfig:
    format: str = key(
        "text",
        check=checks.choice("text", "json"),
        help='"text" (human-readable) or "json" (one JSON object per line); '
        "`run --log-format` wins.",
    )
    level: str = key(
        "info",
        check=checks.choice("debug", "info", "warning", "error"),
        help="The least severe level logged.",
    )
    job_events: str = key(
        "problems",
        check=checks.choice("problems", "all"),
        help="The lines of jobs that go well (claimed, started, completed: three a job): "
        '"problems" logs them only at level "debug", "all" at "info" too. Failures, '
        "retries, cancels, lost leases and fenced outcomes are logged either way, and every "
        "attempt is in the job's history (`pgworkerd show`). Three lines a job cost a "
        "daemon of short jobs about a third of its time.",
    )


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = key(
        "",
        check=checks.listen,
        help="Prometheus endpoint of the daemon (needs `pip install 'pgworkerd[metrics]'`), "
        'e.g. "127.0.0.1:9464", "[::1]:9464" or ":9464" (every interface). Empty: no '
        "endpoint. It serves /metrics: jobs claimed, rescued, completed, failed and fenced "
        "off per handler, lease renewals and losses, jobs in flight, drain state, "
        "enqueue-to-start latency and the jobs per queue and status. A port that cannot be "
        "bound stops the daemon (exit 3). It has no authentication: listen on a loopback or "
        "private address. It serves at most 8 connections at once (a new one takes the "
        "place of the oldest still sending its request), each read or write times out after "
        "5 s and a connection after 10 s.",
    )
    queue_depth_interval: float = key(
        15.0,
        check=checks.positive_duration,
        help="How often the daemon counts the jobs per queue and status for the endpoint: "
        "one GROUP BY over the jobs table, on a connection and thread of its own so the "
        "daemon's loop never waits for it (raise it for very large tables: it reads the "
        "whole table).",
    )
    top_queues: int = key(
        20,
        check=checks.integer(0),
        help="Queue and handler names come from the jobs, which any enqueuer writes, so the "
        "series are bounded: the jobs per queue and status are exported for the queues this "
        "daemon serves, plus this many other queues (those with the most jobs); all the "
        'other queues are summed under queue="other" (a queue really named "other" is '
        "counted with them). A queue that leaves the count (its jobs deleted) leaves the "
        "metrics at the next count. Handler labels are the configured handlers; any other "
        'name counts as "other". Control characters in label values are written as escapes '
        "(\\x1b), and values are cut at 200.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.listen)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of `listen`; host "" means every interface."""
        return checks.split_listen(self.listen)


_WEEK = 7 * 86400.0


@dataclass(frozen=True)
class RetentionConfig:
    """How long finished jobs are kept before the fleet deletes them (pgworkerd.daemon.
    retention); None ("off" or 0 in the file) keeps that status forever."""

    completed: float | None = key(
        _WEEK, check=checks.retention, help="Completed jobs are kept this long."
    )
    cancelled: float | None = key(
        _WEEK, check=checks.retention, help="Cancelled jobs are kept this long."
    )
    dead: float | None = key(
        30 * 86400.0,
        check=checks.retention,
        help="Dead jobs are kept this long (longer: someone may want to retry them).",
    )
    schedule_runs: float | None = key(
        _WEEK,
        check=checks.retention,
        help="Schedule run rows older than this (a one-second schedule adds 86,400 a day); "
        "each schedule's latest run and the runs of its unfinished jobs are always kept.",
    )
    gone_daemons: float | None = key(
        _WEEK,
        check=checks.retention,
        help="Registry rows of daemons gone (stopped, or marked gone after their silence) "
        "this long.",
    )
    interval: float = key(
        300.0,
        check=checks.positive_duration,
        help="How often the fleet as a whole looks when there is nothing to delete: each "
        "daemon waits this long times the number of live daemons (+-50 %), so a fleet of "
        "any size sends about one statement per interval.",
    )
    batch: int = key(
        500,
        check=checks.integer(1, 10_000, " (short transactions)"),
        help="Rows deleted per statement and table, each call its own short transaction; "
        "full batches follow each other 0.2 s apart until the backlog is gone.",
    )

    @property
    def enabled(self) -> bool:
        return any(
            r is not None
            for r in (
                self.completed,
                self.cancelled,
                self.dead,
                self.schedule_runs,
                self.gone_daemons,
            )
        )


# At most this many lines a second of one attempt's output in the daemon's own log.
FORWARD_LINES_MAX = 100_000


@dataclass(frozen=True)
class LogsConfig:
    """Capture of what jobs print (pgworkerd.daemon.joblogs, README "Job logs")."""

    capture: bool = key(
        True,
        check=checks.boolean,
        help="Capture what jobs print (stdout, stderr, Python logging, their subprocesses' "
        "output), per attempt, into the job_logs table; `pgworkerd logs ID` shows it. Off: "
        "jobs print to the daemon's stdout and stderr, as before schema 15.",
    )
    max_bytes_per_attempt: int = key(
        1 << 20,
        check=checks.log_cap,
        help="Kept per attempt: the first half and the last half of this; what lies between "
        "is counted and left out. A running attempt's tail is rewritten about once a second "
        "while it prints.",
    )
    forward_lines_per_second: int = key(
        100,
        check=checks.integer(0, FORWARD_LINES_MAX),
        help="Lines per second and attempt also copied to the daemon's own log (the "
        'journal), tagged "job ID attempt N |"; more are counted and said, never dropped '
        "from the stored copy. 0: none.",
    )


@dataclass(frozen=True)
class WebConfig:
    """`pgworkerd web` (pgworkerd/web): where it listens, who may log in, what it may do."""

    bind: str = key(
        "127.0.0.1",
        check=checks.bind,
        help="Address the dashboard listens on. Anything but a loopback address "
        "(127.0.0.0/8, ::1, localhost) needs [web.users].",
    )
    port: int = key(8470, check=checks.integer(1, 65535), help="Port the dashboard listens on.")
    users: dict[str, str] = key(  # noqa: RUF009 (a field, from its factory)
        factory=dict,
        check=webusers.web_users,
        shown=webusers.user_names,
        example={"alice": "scrypt$16384$8$1$...$..."},
        help='Who may log in: NAME = "HASH", the hash from `pgworkerd web hash-password` '
        "(reads the password from stdin, never from the command line), in this inline table "
        'or in a [web.users] table below [web], one NAME = "HASH" line per user. Actions '
        "are logged with the user's name. Keep this file chmod 600: a hash readable by "
        "others can be guessed offline. Empty: the dashboard does not start unless "
        "allow_anonymous says so.",
    )
    read_only: bool = key(
        False,
        check=checks.boolean,
        help="Pages only: no action (cancel, retry, drain, resume, pause) is offered or "
        "accepted. The database role ([database] dsn) must then be unable to write "
        "(pgworkerd_reader): the dashboard refuses one that can.",
    )
    statement_timeout: float = key(
        5.0,
        check=checks.positive_millis_duration,
        help="Each statement a page runs is cancelled after this long (the page says so): a "
        "slow page cannot hold connections while requests pile up.",
    )
    pool_size: int = key(
        4,
        check=checks.integer(1, 100),
        help="Database connections at most; a request waits up to 5 s for a free one.",
    )
    secure_cookie: bool = key(
        False,
        check=checks.boolean,
        help="The session cookie's Secure flag: set it when an HTTPS reverse proxy fronts "
        "the dashboard (the cookie is always HttpOnly and SameSite=Strict).",
    )
    allow_anonymous: bool = key(
        False,
        check=checks.boolean,
        help="Without users the dashboard does not start, unless this says true (or "
        "`--no-login`): then it has no login at all, on a loopback address only, and every "
        "local account and every process of this host can read every job and act. Said in "
        "the log, on every page and in the process title; requests through a proxy are "
        'refused (README "Web dashboard").',
    )
    idle_timeout: float = key(
        30 * 60.0,
        check=checks.idle_timeout,
        help="A login ends after this long without a request, and after 12 h in any case; "
        "logging out ends it on the server (a copied cookie is then worth nothing).",
    )
    trusted_proxy: str = key(
        "",
        check=checks.ip_address,
        help='The address of a reverse proxy in front of the dashboard (e.g. "127.0.0.1"): '
        "from it, the client's address is the last X-Forwarded-For entry, for login "
        "throttling and audit lines (otherwise every client has the proxy's address and "
        "shares its login budget). Empty: the connection's address; X-Forwarded-For is "
        "never believed. Needs users.",
    )
    action_dsn: str = key(
        "",
        check=checks.string,
        shown=mask_dsn,
        help="The DSN actions run with (pgworkerd_operator; deploy/roles.sql). Set, pages "
        "read with [database] dsn, which must then be a role unable to write "
        "(pgworkerd_reader): the dashboard refuses to start otherwise, and only actions get "
        "the operator's rights. Empty: actions use [database] dsn too.",
    )


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces (pgworkerd.tracing, docs/operations/tracing.md)."""

    enabled: bool = key(
        False,
        check=checks.boolean,
        help="Trace each attempt (a span in the job's child, around the handler) and the "
        "daemon's claims and outcome writes, with OpenTelemetry (pip install "
        "'pgworkerd[otel]'). Off: nothing of OpenTelemetry is imported.",
    )
    provider: str = key(
        "",
        check=checks.optional_target,
        help='A function ("package.module:function") returning the TracerProvider to '
        "export with, called in the daemon and in each job child after its fork. Empty: "
        "the SDK's, exporting with OTLP over HTTP (opentelemetry-exporter-otlp-proto-http) "
        "as the OTEL_* environment variables say.",
        example="myapp.telemetry:tracer_provider",
    )
    attempt_parent: str = key(
        "link",
        check=checks.choice("link", "child"),
        help='"link": each attempt\'s span starts a trace of its own, linked to the span '
        'that enqueued the job. "child": it is a child of that span (one trace from the '
        "request through every attempt, however long the job waits and retries).",
    )

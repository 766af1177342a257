"""The TOML configuration: one frozen dataclass per table, validated with file:line errors.

tomllib gives no positions, so errors locate keys with a small scan of the text (tables
and `key =` lines); good enough to point an operator at the right line.
"""

from __future__ import annotations

import dataclasses
import grp
import importlib
import importlib.util
import math
import os
import pwd
import re
import socket
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgworkerd.bounds import (
    MAX_ATTEMPTS_MAX,
    PAYLOAD_DEPTH_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    check_name,
    name_problem,
    payload_too_deep,
)
from pgworkerd.durations import format_duration, parse_duration
from pgworkerd.jsontext import storable_json
from pgworkerd.masking import mask_dsn
from pgworkerd.names import DEFAULT_SCHEMA, check_schema_name
from pgworkerd.sizes import parse_size


class ConfigError(ValueError):
    """An invalid configuration; the message names the file, key and line."""


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str = ""  # empty: libpq's environment (PGHOST, PGUSER, ...)
    listen_dsn: str = ""  # direct connection for LISTEN when dsn goes through PgBouncer
    schema: str = DEFAULT_SCHEMA
    connect_timeout: float = 5.0
    keepalives_idle: float = 5.0
    tcp_user_timeout: float = 10.0
    statement_timeout: float = 10.0
    # Server-side prepared statements on the daemon's connection; False behind
    # PgBouncer < 1.21 in transaction mode.
    prepared_statements: bool = True


@dataclass(frozen=True)
class WorkerConfig:
    name: str = ""  # prefix of the worker id; default: the host name
    slots: int = 4
    queues: tuple[str, ...] = ()  # default: the queues the handlers name
    lease: float = 60.0
    renew_interval: float = 10.0
    poll_interval: float = 5.0
    drain_timeout: float = 300.0
    kill_grace: float = 10.0
    # `pgworkerd drain --hand-back` without --grace: how long a running job has, once asked
    # to stop (job.stop_requested), to save a checkpoint and return before it is handed
    # back. 30 s: a handler that checkpoints every 10 s saves one (README "Handlers") and a
    # deploy still ends well inside systemd's default 90 s stop timeout.
    stop_grace: float = 30.0
    max_jobs_per_child: int = 1
    warm_children: int = 2
    backoff: float = 10.0
    backoff_max: float = 3600.0
    # Bytes: the default limit of a job's whole process tree (a handler's own wins), and
    # the size past which a reused child (max_jobs_per_child > 1) is replaced after its
    # job; None: none.
    memory_limit: int | None = None
    max_child_memory: int | None = None
    # (first, last) uid of the range job children run as, one uid per live child (README
    # "Per-job uids"); None: children run as the daemon's uid
    job_uids: tuple[int, int] | None = None
    # One cgroup per attempt (README "Per-attempt cgroups"): "auto" where the daemon runs
    # in a cgroup v2 directory delegated to it (systemd's Delegate=yes), "off", or
    # "require" (the daemon refuses to start without one); applies after a restart
    job_cgroups: str = "auto"


# A handler's max_snoozes when not set, and the most it may be set to.
DEFAULT_MAX_SNOOZES = 100
MAX_SNOOZES_LIMIT = 1_000_000


@dataclass(frozen=True)
class HandlerConfig:
    name: str
    target: str  # "module:function"
    queue: str = "default"
    # When set, the handler claims only from these queues (claim_v2, schema 6), and they
    # are the ones it adds to the served queues instead of `queue`; empty: it claims from
    # every queue the daemon serves
    queues: tuple[str, ...] = ()
    max_attempts: int | None = None  # overrides the job's own when set
    backoff: float | None = None  # base of the exponential backoff; default worker.backoff
    backoff_max: float | None = None
    lease: float | None = None  # default worker.lease
    timeout: float | None = None  # whole-attempt limit; None: no limit
    heartbeat_timeout: float | None = None  # silence limit; None: not watched
    slots: int | None = None  # at most this many at once on this daemon
    # Fleet-wide limits, enforced by the claim (claim_v3): at most this many running at
    # once across every daemon, and at most this many per concurrency key; None: none.
    max_running: int | None = None
    max_running_per_key: int | None = None
    # Handler-controlled outcomes: how often one job may snooze (pgworkerd.Snooze) before
    # a snooze counts as a failed attempt, and the exception types (qualified names,
    # matched along the raised exception's MRO) that end a job as dead at once.
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    no_retry: tuple[str, ...] = ()
    memory_limit: int | None = None  # bytes, the job's process tree; default worker's
    stop_grace: float | None = None  # hand-back grace of its jobs; default worker.stop_grace

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]


# The bounds of [logs] max_bytes_per_attempt: less is a typo; more would make every
# running attempt's once-a-second write of its tail heavy (README "Job logs").
LOG_CAP_MIN = 4 << 10
LOG_CAP_MAX = 64 << 20
# At most this many lines a second of one attempt's output in the daemon's own log.
FORWARD_LINES_MAX = 100_000


@dataclass(frozen=True)
class LogsConfig:
    """Capture of what jobs print (pgworkerd.daemon.joblogs, README "Job logs")."""

    capture: bool = True
    # per attempt: the first half and the last half of this are kept in job_logs
    max_bytes_per_attempt: int = 1 << 20
    # lines a second per attempt copied to the daemon's own log (0: none); more are
    # counted and said, never dropped from the stored copy
    forward_lines_per_second: int = 100


@dataclass(frozen=True)
class LoggingConfig:
    format: str = "text"  # or "json"
    level: str = "info"


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = ""  # "HOST:PORT" for the Prometheus endpoint; empty: no endpoint
    queue_depth_interval: float = 15.0  # how often the job counts are refreshed
    top_queues: int = 20  # queues labelled besides the served ones; the rest are "other"

    @property
    def enabled(self) -> bool:
        return bool(self.listen)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of `listen`; host "" means every interface."""
        return split_listen(self.listen)


@dataclass(frozen=True)
class RetentionConfig:
    """How long finished jobs are kept before the fleet deletes them (pgworkerd.daemon.
    retention); None ("off" or 0 in the file) keeps that status forever."""

    completed: float | None = 7 * 86400.0
    cancelled: float | None = 7 * 86400.0
    dead: float | None = 30 * 86400.0  # kept longer: someone may want to retry them
    # schedule_runs rows by tick (a one-second schedule adds 86,400 a day); each schedule's
    # latest run and the runs of its unfinished jobs are always kept
    schedule_runs: float | None = 7 * 86400.0
    # the registry rows of daemons gone (stopped, or marked gone) this long ago
    gone_daemons: float | None = 7 * 86400.0
    interval: float = 300.0  # how often the fleet as a whole looks when there is nothing to do
    batch: int = 500  # rows per delete and table (each call its own short transaction)

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


@dataclass(frozen=True)
class WebConfig:
    """`pgworkerd web` (pgworkerd/web): where it listens, who may log in, what it may do."""

    bind: str = "127.0.0.1"  # anything but a loopback address needs `users`
    port: int = 8470
    # user name -> password hash from `pgworkerd web hash-password`; empty: the dashboard
    # does not start unless allow_anonymous says so
    users: dict[str, str] = field(default_factory=dict)
    read_only: bool = False  # pages only: no action is offered or accepted
    statement_timeout: float = 5.0  # per statement: a slow page fails instead of piling up
    pool_size: int = 4  # database connections at most (the pool's max_size)
    # Secure flag on the session cookie: set it when an HTTPS proxy fronts the dashboard
    secure_cookie: bool = False
    # No login at all (no users): the operator's explicit choice, loopback only, loud in
    # the log, every page and the process title (README "Web dashboard")
    allow_anonymous: bool = False
    # A session not used for this long is over (and logout ends it on the server)
    idle_timeout: float = 30 * 60.0
    # The address of a reverse proxy in front (e.g. "127.0.0.1"): from it, the client's
    # address is the last X-Forwarded-For entry (login throttling, audit lines); empty:
    # the peer's address, X-Forwarded-For never believed
    trusted_proxy: str = ""
    # The DSN actions run with (pgworkerd_operator); empty: actions use database.dsn. Set,
    # the pages' DSN (database.dsn) must be a role that cannot write (pgworkerd_reader):
    # the dashboard refuses to start otherwise (N9)
    action_dsn: str = ""


# -- schedules (periodic jobs) ---------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleConfig:
    """A periodic job: `cron` in `timezone`, or `every` (whole seconds, ticking on
    multiples of it since the Unix epoch so that every host computes the same ticks)."""

    name: str
    handler: str
    cron: str = ""
    timezone: str = "UTC"
    every: float | None = None
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = ""  # resolved by parse_config: the handler's queue, else "default"
    priority: int = 0
    max_attempts: int | None = None  # None: enqueue's default
    overlap: str = "skip"  # "skip" | "allow" | "queue_one"
    catch_up: str = "last"  # "last" | "none"

    def definition(self) -> dict[str, Any]:
        """What the database keeps of it (schedules.definition) and `schedules` shows."""
        data = dataclasses.asdict(self)
        del data["name"]
        return data

    def job(self) -> dict[str, Any]:
        """The job object a tick enqueues (enqueue_many's form)."""
        job: dict[str, Any] = {
            "handler": self.handler,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
        }
        if self.max_attempts is not None:
            job["max_attempts"] = self.max_attempts
        return job


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


# -- locating keys in the text -------------------------------------------------------------

_TABLE_RE = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*(\"[^\"]*\"|[A-Za-z0-9_-]+)\s*=")


def _locate(text: str, table: str, key: str | None) -> int | None:
    """Line number of `key` inside `[table]` (or of the table header when key is None;
    failing that, of a `table = ...` line in the parent table, or of a `[table.sub]`)."""
    current = ""
    header_line = None
    parent, _, last = table.rpartition(".")
    for number, line in enumerate(text.splitlines(), 1):
        m = _TABLE_RE.match(line)
        if m:
            current = ".".join(p.strip().strip('"') for p in m[1].split("."))
            if header_line is None and (
                current == table or (key is None and current.startswith(table + "."))
            ):
                header_line = number
            continue
        if key is None and header_line is None and current == parent:
            k = _KEY_RE.match(line)
            if k and k[1].strip('"') == last:
                header_line = number
        if key is not None and current == table:
            k = _KEY_RE.match(line)
            if k and k[1].strip('"') == key:
                return number
    return header_line


class _Reader:
    """Reads one table of the parsed TOML, converting and checking each key."""

    def __init__(self, path: str, text: str, table: str, values: Any) -> None:
        self.path, self.text, self.table = path, text, table
        if not isinstance(values, dict):
            raise self.error(None, "must be a table")
        self.values: dict[str, Any] = values
        self.used: set[str] = set()

    def error(self, key: str | None, message: str) -> ConfigError:
        line = _locate(self.text, self.table, key)
        where = f"{self.path}:{line}" if line else self.path
        name = f"{self.table}.{key}" if key else f"[{self.table}]"
        return ConfigError(f"{where}: {name}: {message}")

    def get(self, key: str, default: Any, convert: Callable[[Any], Any]) -> Any:
        self.used.add(key)
        if key not in self.values:
            return default
        try:
            return convert(self.values[key])
        except (TypeError, ValueError) as exc:
            raise self.error(key, str(exc)) from None

    def finish(self, known: list[str]) -> None:
        unknown = sorted(set(self.values) - self.used)
        if unknown:
            raise self.error(
                unknown[0], f"unknown key (known keys here: {', '.join(sorted(known))})"
            )


def _describe(value: Any) -> str:
    """A value for an error message: scalars as written (bounded), tables and arrays by
    kind only, since they may hold a password (`dsn = { password = ... }`) or be huge."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_describe(value)}")
    return value


def _nonempty(value: Any) -> str:
    if not _string(value):
        raise ValueError("must not be empty")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {_describe(value)}")
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {_describe(value)}")
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _positive_limit(value: Any) -> int:
    """A fleet-wide limit: the claim passes it as a PostgreSQL integer."""
    value = _positive_int(value)
    if value > 2**31 - 1:
        raise ValueError(f"must be at most {2**31 - 1}, got {value}")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {_describe(value)}")
    return value


# Longer makes no sense for any setting, and now() + it must stay a valid timestamp.
_MAX_DURATION = 100 * 365 * 86400.0
# Settings PostgreSQL and libpq take in milliseconds as a 32-bit integer (about 24 days).
_MAX_MILLIS_DURATION = (2**31 - 1) / 1000


def _duration(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f'expected a duration like "30s", got {type(value).__name__}')
    seconds = parse_duration(value)
    if math.isnan(seconds) or seconds > _MAX_DURATION:
        raise ValueError(f"{value!r} is out of range (at most 100 years)")
    return seconds


# The longest hand-back grace: `drain --hand-back --grace` and stop_grace (and the SQL
# function drain_request, migration 0017) refuse more. A drain that waits longer than a
# day is no drain; a typo ("30d" for "30s") must not park a host for a month.
MAX_STOP_GRACE = 86400.0


def stop_grace_problem(seconds: float) -> str | None:
    """Why `seconds` cannot be a hand-back grace, or None."""
    if math.isnan(seconds) or seconds < 0:
        return f"must be a duration from 0 to 1 day, got {seconds!r} s"
    if seconds > MAX_STOP_GRACE:
        return f"must be at most 1 day (a drain, not a schedule), got {format_duration(seconds)}"
    return None


def _stop_grace(value: Any) -> float:
    seconds = _duration(value)
    problem = stop_grace_problem(seconds)
    if problem:
        raise ValueError(problem)
    return seconds


def _millis_duration(value: Any) -> float:
    seconds = _duration(value)
    if seconds > _MAX_MILLIS_DURATION:
        raise ValueError(f"{value!r} is out of range (at most 24d: milliseconds in 32 bits)")
    return seconds


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f'expected a size like "2GiB", got {_describe(value)}')
    return parse_size(value)


def _positive_duration(value: Any) -> float:
    seconds = _duration(value)
    if seconds <= 0:
        raise ValueError(f"must be longer than zero, got {value!r}")
    return seconds


# The lowest uid job_uids may name: below it are the system's own accounts (Debian's
# SYS_UID_MAX is 999); 65534 and up hold nobody, overflow uids and namespaces' mappings.
JOB_UID_MIN = 1000
JOB_UID_MAX = 65533


def _uid_range(value: Any) -> tuple[int, int]:
    """A range of uids "FIRST-LAST" (inclusive), e.g. "61000-61063"."""
    text = _string(value)
    m = re.fullmatch(r"\s*(\d{1,9})\s*-\s*(\d{1,9})\s*", text)
    if m is None:
        raise ValueError(f'expected a uid range like "61000-61063", got {text!r}')
    first, last = int(m[1]), int(m[2])
    if first > last:
        raise ValueError(f"{text!r}: the first uid is above the last")
    if first < JOB_UID_MIN or last > JOB_UID_MAX:
        raise ValueError(
            f"{text!r}: must lie within {JOB_UID_MIN}-{JOB_UID_MAX} (below are system "
            "accounts, above nobody and the overflow uids)"
        )
    return first, last


def _string_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"expected a list of non-empty strings, got {_describe(value)}")
    return tuple(value)


def _queue_names(value: Any) -> tuple[str, ...]:
    # the bounds enqueue applies: a queue no job can be enqueued in would never run anything
    return tuple(check_name("queue", v) for v in _string_list(value))


def _choice(*choices: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {_describe(value)}")
        return str(value)

    return convert


def _target(value: Any) -> str:
    text = _string(value)
    module, sep, function = text.partition(":")
    ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
    if not sep or not all(ident.match(p) for p in module.split(".")) or not ident.match(function):
        raise ValueError(f'expected "package.module:function", got {text!r}')
    return text


_HOST_RE = re.compile(r"^[A-Za-z0-9._-]*$")


def split_listen(text: str) -> tuple[str, int]:
    """Split `listen`: HOST:PORT, [IPV6]:PORT or :PORT (every interface)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f'expected "HOST:PORT" (e.g. "127.0.0.1:9464"), got {text!r}')
    if host.startswith("[") and host.endswith("]") and ":" in host:
        host = host[1:-1]
        if not re.fullmatch(r"[0-9A-Fa-f:.]+", host):
            raise ValueError(f"{text!r}: not an IPv6 address in brackets")
    elif not _HOST_RE.match(host):
        raise ValueError(f'{text!r}: bad host (IPv6 addresses go in brackets: "[::1]:9464")')
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listen(value: Any) -> str:
    text = _string(value)
    if text:
        split_listen(text)
    return text


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _read_table(
    reader: _Reader, cls: type, converters: Mapping[str, Callable[[Any], Any]], **fixed: Any
) -> Any:
    defaults = cls(**fixed) if fixed else cls()
    kwargs = {
        name: reader.get(name, getattr(defaults, name), convert)
        for name, convert in converters.items()
        if name not in fixed
    }
    reader.used.update(fixed)
    reader.finish(list(converters))
    return cls(**fixed, **kwargs)


_DATABASE = {
    "dsn": _string,
    "listen_dsn": _string,
    "schema": lambda v: check_schema_name(_string(v)),
    "connect_timeout": _positive_duration,
    "keepalives_idle": _positive_duration,
    "tcp_user_timeout": _millis_duration,
    "statement_timeout": _millis_duration,
    "prepared_statements": _bool,
}
_WORKER = {
    "name": _string,
    "slots": _positive_int,
    "queues": _queue_names,
    "lease": _positive_duration,
    "renew_interval": _positive_duration,
    "poll_interval": _positive_duration,
    "drain_timeout": _duration,
    "kill_grace": _duration,
    "stop_grace": _stop_grace,
    "max_jobs_per_child": _positive_int,
    "warm_children": _non_negative_int,
    "backoff": _duration,
    "backoff_max": _duration,
    "memory_limit": _size,
    "max_child_memory": _size,
    "job_uids": _uid_range,
    "job_cgroups": _choice("auto", "off", "require"),
}


def _retention(value: Any) -> float | None:
    """A retention: a duration, or "off" (or 0) to keep forever."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    seconds = _duration(value)
    if seconds < 0:
        raise ValueError(f'must be a duration >= 0 or "off", got {value!r}')
    return None if seconds == 0 else seconds


def _prune_batch(value: Any) -> int:
    value = _positive_int(value)
    if value > 10_000:
        raise ValueError(f"must be at most 10000 (short transactions), got {value}")
    return value


_RETENTION = {
    "completed": _retention,
    "cancelled": _retention,
    "dead": _retention,
    "schedule_runs": _retention,
    "gone_daemons": _retention,
    "interval": _positive_duration,
    "batch": _prune_batch,
}


def _log_cap(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f'expected a size like "1MiB", got {_describe(value)}')
    return parse_size(value, minimum=LOG_CAP_MIN, maximum=LOG_CAP_MAX)


def _forward_lines(value: Any) -> int:
    count = _non_negative_int(value)
    if count > FORWARD_LINES_MAX:
        raise ValueError(f"must be at most {FORWARD_LINES_MAX}, got {count}")
    return count


_LOGS = {
    "capture": _bool,
    "max_bytes_per_attempt": _log_cap,
    "forward_lines_per_second": _forward_lines,
}
_LOGGING = {
    "format": _choice("text", "json"),
    "level": _choice("debug", "info", "warning", "error"),
}


def _bind(value: Any) -> str:
    text = _nonempty(value)
    if not _HOST_RE.match(text) and not re.fullmatch(r"[0-9A-Fa-f:.]+", text):
        raise ValueError(f"expected a host name or an IP address, got {_describe(value)}")
    return text


def _int_up_to(high: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        number = _positive_int(value)
        if number > high:
            raise ValueError(f"must be at most {high}, got {number}")
        return number

    return convert


def _web_users(value: Any) -> dict[str, str]:
    """[web.users]: NAME = "scrypt$..." (a hash, never a password)."""
    from pgworkerd.web.passwords import hash_problem

    if not isinstance(value, dict):
        raise TypeError(f"expected a table of NAME = HASH, got {_describe(value)}")
    for name, hashed in value.items():
        problem = name_problem("user", name)
        if problem:
            raise ValueError(problem)
        if not isinstance(hashed, str) or hash_problem(hashed):
            # the value is never shown: someone may have put a password there
            raise ValueError(
                f"user {name!r}: not a password hash (make one with "
                "`pgworkerd web hash-password`, which reads the password from stdin)"
            )
    return dict(value)


def _ip_address(value: Any) -> str:
    import ipaddress

    text = _string(value)
    if text:
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(f"expected an IP address, got {_describe(value)}") from None
    return text


def _idle_timeout(value: Any) -> float:
    seconds = _positive_duration(value)
    if not 60 <= seconds <= 12 * 3600:  # a login lasts 12 h at most anyway
        raise ValueError(f"must be from 1m to 12h, got {value!r}")
    return seconds


_WEB = {
    "bind": _bind,
    "port": _int_up_to(65535),
    "users": _web_users,
    "allow_anonymous": _bool,
    "idle_timeout": _idle_timeout,
    "trusted_proxy": _ip_address,
    "read_only": _bool,
    "statement_timeout": lambda v: _positive_duration(_millis_duration(v)),
    "pool_size": _int_up_to(100),
    "secure_cookie": _bool,
    "action_dsn": _string,
}
_METRICS = {
    "listen": _listen,
    "queue_depth_interval": _positive_duration,
    "top_queues": _non_negative_int,
}


def _cron(value: Any) -> str:
    from pgworkerd.cadence import cron_problem  # imports the cron library only when used

    text = _nonempty(value)
    problem = cron_problem(text)
    if problem:
        raise ValueError(f"bad cron expression {text!r}: {problem}")
    return text


def _timezone(value: Any) -> str:
    from pgworkerd.cadence import zone_problem

    text = _nonempty(value)
    problem = zone_problem(text)
    if problem:
        raise ValueError(problem)
    return text


def _every(value: Any) -> float:
    seconds = _positive_duration(value)
    if seconds < 1 or seconds != int(seconds):
        raise ValueError(f"must be whole seconds, at least 1s, got {value!r}")
    return seconds


def _payload(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a table (a JSON object), got {_describe(value)}")
    return value


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {_describe(value)}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"must be from {PRIORITY_MIN} to {PRIORITY_MAX}, got {value}")
    return value


def _max_attempts(value: Any) -> int:
    attempts = _positive_int(value)
    if attempts > MAX_ATTEMPTS_MAX:
        raise ValueError(f"must be at most {MAX_ATTEMPTS_MAX}, got {attempts}")
    return attempts


_SCHEDULE = {
    "handler": lambda v: check_name("handler", _nonempty(v)),
    "cron": _cron,
    "timezone": _timezone,
    "every": _every,
    "payload": _payload,
    "queue": lambda v: check_name("queue", _nonempty(v)),
    "priority": _priority,
    "max_attempts": _max_attempts,
    "overlap": _choice("skip", "allow", "queue_one"),
    "catch_up": _choice("last", "none"),
}


def _read_schedules(
    path: str, text: str, table: Any, handlers: dict[str, HandlerConfig]
) -> dict[str, ScheduleConfig]:
    """The [schedules.NAME] tables; a schedule name is checked like a handler name."""
    if not isinstance(table, dict):
        line = _locate(text, "schedules", None)
        where = f"{path}:{line}" if line else path
        raise ConfigError(f"{where}: [schedules] must be a table of [schedules.NAME] tables")
    schedules = {}
    for name, values in table.items():
        problem = name_problem("schedule", name)
        if problem:  # repr: the name may hold control characters
            line = _locate(text, f"schedules.{name}", None)
            raise ConfigError(f"{path}:{line or '?'}: [schedules.{name!r}]: {problem}")
        reader = _Reader(path, text, f"schedules.{name}", values)
        if "handler" not in values:
            raise reader.error(None, 'missing key "handler"')
        if ("cron" in values) == ("every" in values):
            raise reader.error(
                None,
                'needs exactly one of "cron" (with "timezone") or "every", not '
                + ("both" if "cron" in values else "neither"),
            )
        if "timezone" in values and "cron" not in values:
            raise reader.error("timezone", 'applies to "cron" only (an interval has no zone)')
        handler = reader.get("handler", None, _SCHEDULE["handler"])
        schedule = _read_table(reader, ScheduleConfig, _SCHEDULE, name=name, handler=handler)
        if not schedule.queue:
            declared = handlers.get(schedule.handler)
            queue = declared.queue if declared is not None else "default"
            schedule = dataclasses.replace(schedule, queue=queue)
        # What enqueue would refuse fails every tick, forever: refused here instead. JSON
        # that jsonb stores (TOML dates are not JSON; a NUL character jsonb cannot hold).
        try:
            storable_json(schedule.payload)
        except (TypeError, ValueError) as exc:
            raise reader.error("payload", f"not JSON: {exc}") from None
        if payload_too_deep(schedule.payload):
            raise reader.error("payload", f"nested deeper than {PAYLOAD_DEPTH_MAX} levels")
        schedules[name] = schedule
    return schedules


def _max_snoozes(value: Any) -> int:
    count = _non_negative_int(value)
    if count > MAX_SNOOZES_LIMIT:
        raise ValueError(f"must be at most {MAX_SNOOZES_LIMIT}, got {count}")
    return count


_TYPE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_NO_RETRY = 64  # the child reports at most 64 names along an exception's MRO


def _exception_type_names(value: Any) -> tuple[str, ...]:
    """no_retry: qualified exception type names ("ValueError", "myapp.errors.Permanent")."""
    names = _string_list(value)
    if len(names) > MAX_NO_RETRY:
        raise ValueError(f"at most {MAX_NO_RETRY} exception types, got {len(names)}")
    for name in names:
        if len(name) > 512 or not _TYPE_NAME_RE.match(name):
            raise ValueError(
                f'expected exception type names like "ValueError" or '
                f'"myapp.errors.PermanentError", got {name[:80]!r}'
            )
    return tuple(names)


_HANDLER = {
    "target": _target,
    "queue": lambda v: check_name("queue", _nonempty(v)),
    "queues": _queue_names,
    "max_attempts": _positive_int,
    "backoff": _duration,
    "backoff_max": _duration,
    "lease": _positive_duration,
    "timeout": _positive_duration,
    "heartbeat_timeout": _positive_duration,
    "slots": _positive_int,
    "max_running": _positive_limit,
    "max_running_per_key": _positive_limit,
    "max_snoozes": _max_snoozes,
    "no_retry": _exception_type_names,
    "memory_limit": _size,
    "stop_grace": _stop_grace,
}


def parse_config(text: str, path: str = "<config>") -> Config:
    """Parse and validate a config text; raises ConfigError naming file, key and line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        # tomllib recurses once per nested array or inline table.
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    known_tables = [
        "database",
        "worker",
        "logging",
        "metrics",
        "handlers",
        "schedules",
        "retention",
        "logs",
        "web",
    ]
    for table, value in data.items():
        if table not in known_tables:
            line = _locate(text, table, None)
            if isinstance(value, dict):
                what = f"[{table}]: unknown table"
            else:
                what = f"{table}: unknown top-level key"
            raise ConfigError(f"{path}:{line or '?'}: {what} (known: {', '.join(known_tables)})")
    database = _read_table(
        _Reader(path, text, "database", data.get("database", {})), DatabaseConfig, _DATABASE
    )
    worker = _read_table(
        _Reader(path, text, "worker", data.get("worker", {})), WorkerConfig, _WORKER
    )
    logging = _read_table(
        _Reader(path, text, "logging", data.get("logging", {})), LoggingConfig, _LOGGING
    )
    metrics = _read_table(
        _Reader(path, text, "metrics", data.get("metrics", {})), MetricsConfig, _METRICS
    )
    handlers_table = data.get("handlers", {})
    if not isinstance(handlers_table, dict):
        line = _locate(text, "handlers", None)
        where = f"{path}:{line}" if line else path
        raise ConfigError(f"{where}: [handlers] must be a table of [handlers.NAME] tables")
    handlers = {}
    for name, values in handlers_table.items():
        problem = name_problem("handler", name)
        if problem:  # as enqueue would refuse it; repr: the name may hold control characters
            line = _locate(text, f"handlers.{name}", None)
            raise ConfigError(f"{path}:{line or '?'}: [handlers.{name!r}]: {problem}")
        reader = _Reader(path, text, f"handlers.{name}", values)
        if "target" not in values:
            raise reader.error(None, 'missing key "target" ("package.module:function")')
        target = reader.get("target", None, _target)
        handlers[name] = _read_table(reader, HandlerConfig, _HANDLER, name=name, target=target)
    schedules = _read_schedules(path, text, data.get("schedules", {}), handlers)
    retention = _read_table(
        _Reader(path, text, "retention", data.get("retention", {})), RetentionConfig, _RETENTION
    )
    logs = _read_table(_Reader(path, text, "logs", data.get("logs", {})), LogsConfig, _LOGS)
    web = _read_table(_Reader(path, text, "web", data.get("web", {})), WebConfig, _WEB)
    config = Config(
        path, database, worker, logging, handlers, metrics, schedules, retention, logs, web
    )
    _cross_check(config, text)
    return config


def _cross_check(config: Config, text: str) -> None:
    """Relations between keys that single values cannot show."""
    path, w = config.path, config.worker

    def error(table: str, key: str, message: str) -> ConfigError:
        line = _locate(text, table, key)
        return ConfigError(f"{path}:{line or '?'}: {table}.{key}: {message}")

    for h in [None, *config.handlers.values()]:
        lease = w.lease if h is None or h.lease is None else h.lease
        table = "worker" if h is None or h.lease is None else f"handlers.{h.name}"
        if w.renew_interval > lease / 3:
            raise error(
                "worker",
                "renew_interval",
                f"{format_duration(w.renew_interval)} must be at most a third of the lease "
                f"({format_duration(lease)} in [{table}]) so a lease survives two missed "
                "renewals",
            )
    if config.metrics.enabled and importlib.util.find_spec("prometheus_client") is None:
        raise error(
            "metrics",
            "listen",
            "the Prometheus endpoint needs prometheus-client, which is not installed "
            "(pip install 'pgworkerd[metrics]'); or leave listen empty",
        )
    if config.web.users == {} and not is_loopback(config.web.bind):
        raise error(
            "web",
            "bind",
            f"{config.web.bind!r} is not a loopback address: the dashboard needs [web.users] "
            "(a login) to listen there",
        )
    if config.web.users and config.web.allow_anonymous:
        raise error(
            "web",
            "allow_anonymous",
            "contradicts [web.users]: with users every page needs a login; remove one of them",
        )
    if config.web.action_dsn and config.web.read_only:
        raise error(
            "web",
            "action_dsn",
            "contradicts read_only: a read-only dashboard runs no action; remove one of them",
        )
    if config.web.trusted_proxy and not config.web.users:
        raise error(
            "web",
            "trusted_proxy",
            "needs [web.users]: a dashboard without a login never answers through a proxy",
        )
    if w.backoff_max < w.backoff:
        raise error("worker", "backoff_max", "must not be shorter than worker.backoff")
    if w.job_uids is not None:
        problem = _job_uids_problem(w)
        if problem:
            raise error("worker", "job_uids", problem)
    for h in config.handlers.values():
        if w.queues and not h.queues and h.queue not in w.queues:
            raise error(
                f"handlers.{h.name}",
                "queue",
                f"{h.queue!r} is not among worker.queues {list(w.queues)}: its jobs would "
                "never run here",
            )
        if w.queues and not set(h.queues) <= set(w.queues):
            raise error(
                f"handlers.{h.name}",
                "queues",
                f"{sorted(set(h.queues) - set(w.queues))} not among worker.queues "
                f"{list(w.queues)}: its jobs there would never run",
            )
        if h.slots is not None and h.slots > w.slots:
            raise error(
                f"handlers.{h.name}", "slots", f"{h.slots} exceeds worker.slots ({w.slots})"
            )
        if (
            h.heartbeat_timeout is not None
            and h.timeout is not None
            and (h.heartbeat_timeout > h.timeout)
        ):
            raise error(
                f"handlers.{h.name}",
                "heartbeat_timeout",
                "is longer than timeout, so it would never apply",
            )


def _job_uids_problem(w: WorkerConfig) -> str | None:
    """Why worker.job_uids cannot be used with these settings: too few uids for the
    children that live at once, or uids (or gids: a child's gid is its uid) of accounts
    or groups this host has, whose files and processes a job would own."""
    assert w.job_uids is not None
    first, last = w.job_uids
    size, needed = last - first + 1, w.slots + w.warm_children
    if size < needed:
        return (
            f"{size} uid(s) for {needed} children at once (slots {w.slots} + warm_children "
            f"{w.warm_children}): widen the range (twice that leaves room for children "
            "still exiting)"
        )
    users = sorted((u.pw_uid, u.pw_name) for u in pwd.getpwall() if first <= u.pw_uid <= last)
    if users:
        uid, name = users[0]
        return f"uid {uid} belongs to the user {name!r}: choose a range no account uses"
    groups = sorted((g.gr_gid, g.gr_name) for g in grp.getgrall() if first <= g.gr_gid <= last)
    if groups:
        gid, name = groups[0]
        return (
            f"gid {gid} belongs to the group {name!r} (a job's gid is its uid): choose a "
            "range no account or group uses"
        )
    return None


def load_config(path: str | Path) -> Config:
    """Read and validate a config file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")  # TOML is UTF-8 whatever the locale says
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p}:{line}: not UTF-8 text (TOML must be UTF-8): byte 0x{data[exc.start]:02x}"
        ) from None
    return parse_config(text, str(p))


def _holds_password(dsn: str) -> bool:
    return bool(dsn) and mask_dsn(dsn) != dsn


def file_warnings(config: Config) -> list[str]:
    """What others could do with the config file: read its password, or rewrite it (and
    with it the handlers' code, since a target is imported as written). Warnings, not
    errors: the operator decides, and a running daemon keeps running."""
    path = Path(config.path)
    try:
        st = path.stat()
    except OSError:
        return []
    found = []
    own_groups = {os.getgid(), os.getegid(), *os.getgroups()}
    if st.st_mode & stat.S_IROTH:
        readable = "others"
    elif st.st_mode & stat.S_IRGRP and st.st_gid not in own_groups:
        try:
            readable = f"group {grp.getgrgid(st.st_gid).gr_name}"
        except KeyError:
            readable = f"group {st.st_gid}"
    else:
        readable = ""
    if readable and (
        _holds_password(config.database.dsn) or _holds_password(config.database.listen_dsn)
    ):
        found.append(
            f"{path} holds a database password and is readable by {readable}: "
            f"chmod 600 {path} (or move the password to ~/.pgpass or PGPASSWORD)"
        )
    if readable and config.web.users:
        # a hash is slow to guess, not impossible: offline guessing needs no throttle
        found.append(
            f"{path} holds [web.users] password hashes and is readable by {readable}, who "
            f"can guess passwords offline: chmod 600 {path}"
        )
    if st.st_mode & stat.S_IWOTH:
        found.append(
            f"{path} is writable by others, who could change its handlers: chmod o-w {path}"
        )
    # The directory (of the link and of its target): there, others could replace the file.
    for directory in dict.fromkeys([path.absolute().parent, path.resolve().parent]):
        try:
            mode = directory.stat().st_mode
        except OSError:
            continue
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            found.append(
                f"{path} is in {directory}, which others can write (no sticky bit): they "
                f"could replace the file; keep it in a directory only its owner can write"
            )
    return found


def import_handler(handler: HandlerConfig) -> Callable[..., Any]:
    """Import a handler's function; ConfigError explains what went wrong."""
    module_name, _, function = handler.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is a config error
        raise ConfigError(
            f"handler {handler.name!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    func = getattr(module, function, None)
    if not callable(func):
        raise ConfigError(f"handler {handler.name!r}: {module_name!r} has no function {function!r}")
    return func


def effective(config: Config) -> dict[str, Any]:
    """The effective config as plain data, passwords masked (for check-config)."""
    data = dataclasses.asdict(config)
    data["database"]["dsn"] = mask_dsn(config.database.dsn)
    data["database"]["listen_dsn"] = mask_dsn(config.database.listen_dsn)
    data["web"]["action_dsn"] = mask_dsn(config.web.action_dsn)
    data["worker"]["queues"] = list(config.queues)
    if config.worker.job_uids is not None:  # as written in the file
        data["worker"]["job_uids"] = "{}-{}".format(*config.worker.job_uids)
    data["web"]["users"] = sorted(config.web.users)  # names only
    return data

"""Value checks: each turns one TOML value into what the code uses, or raises TypeError or
ValueError saying what is wrong and what is allowed (the loader adds the file, line and
key). Each check also says in words what it takes (the reference's "allowed" line) and how
a value is written back in TOML (durations as "30s", sizes as "1MiB"), so a bound is
written once: where the check is made."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pgworkerd.bounds import (
    DEDUPE_KEY_MAX_CHARS,
    DEDUPE_WINDOW_MAX_SECONDS,
    MAX_ATTEMPTS_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    check_name,
)
from pgworkerd.durations import format_duration, parse_duration
from pgworkerd.names import check_schema_name
from pgworkerd.sizes import parse_size

T = TypeVar("T")


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Check(Generic[T]):
    """A value check: `convert` a TOML value (raising TypeError or ValueError); `allowed`
    in words; `written`: a converted value (never None) as TOML holds it; `unset`: how
    the file says None, when it can ("off")."""

    convert: Callable[[Any], T]
    allowed: str
    written: Callable[[Any], Any] = _as_is
    unset: str | None = None

    def __call__(self, value: Any) -> T:
        return self.convert(value)


def describe(value: Any) -> str:
    """A value for an error message: scalars as written (bounded), tables and arrays by
    kind only, since they may hold a password (`dsn = { password = ... }`) or be huge."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


# -- strings and flags -----------------------------------------------------------------------


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {describe(value)}")
    return value


def _nonempty(value: Any) -> str:
    if not _string(value):
        raise ValueError("must not be empty")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {describe(value)}")
    return value


string = Check(_string, "a string")
nonempty = Check(_nonempty, "a non-empty string")
boolean = Check(_bool, "true or false")
schema_name = Check(
    lambda v: check_schema_name(_string(v)), "a PostgreSQL schema name (an identifier)"
)


def choice(*choices: str) -> Check[str]:
    def convert(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {describe(value)}")
        return str(value)

    return Check(convert, "one of " + ", ".join(f'"{c}"' for c in choices))


def _dedupe_key(value: Any) -> str:
    text = _nonempty(value)
    if len(text) > DEDUPE_KEY_MAX_CHARS:
        raise ValueError(f"must be at most {DEDUPE_KEY_MAX_CHARS} characters, got {len(text)}")
    return text


dedupe_key = Check(_dedupe_key, f"a string of 1 to {DEDUPE_KEY_MAX_CHARS} characters")


def named(kind: str) -> Check[str]:
    """A queue or handler name, with the bounds enqueue applies to it."""
    return Check(lambda v: check_name(kind, _nonempty(v)), f"a {kind} name, as enqueue takes it")


# -- integers --------------------------------------------------------------------------------


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {describe(value)}")
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {describe(value)}")
    return value


def integer(minimum: int = 1, maximum: int | None = None, why: str = "") -> Check[int]:
    """An integer from `minimum` (0 or 1) to `maximum`; `why` explains the upper bound."""
    low = _positive_int if minimum == 1 else _non_negative_int
    assert minimum in (0, 1)

    def convert(value: Any) -> int:
        number = low(value)
        if maximum is not None and number > maximum:
            raise ValueError(f"must be at most {maximum}{why}, got {number}")
        return number

    if maximum is None:
        return Check(convert, f"an integer >= {minimum}")
    return Check(convert, f"an integer from {minimum} to {maximum}")


# The claim passes fleet-wide limits as PostgreSQL integers.
INT4_MAX = 2**31 - 1


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {describe(value)}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"must be from {PRIORITY_MIN} to {PRIORITY_MAX}, got {value}")
    return value


priority = Check(_priority, f"an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
max_attempts = integer(1, MAX_ATTEMPTS_MAX)


# -- durations -------------------------------------------------------------------------------

# Longer makes no sense for any setting, and now() + it must stay a valid timestamp.
MAX_DURATION = 100 * 365 * 86400.0
# Settings PostgreSQL and libpq take in milliseconds as a 32-bit integer (about 24 days).
MAX_MILLIS_DURATION = (2**31 - 1) / 1000
# The longest hand-back grace: `drain --hand-back --grace` and stop_grace (and the SQL
# function drain_request, migration 0017) refuse more. A drain that waits longer than a
# day is no drain; a typo ("30d" for "30s") must not park a host for a month.
MAX_STOP_GRACE = 86400.0


def duration_text(seconds: float) -> str:
    """`seconds` as an operator writes it in the file: "250ms", "30s", "5m", "7d"."""
    if seconds < 120 and seconds == int(seconds):
        return f"{seconds:g}s"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size) == int(seconds / size):
            return f"{seconds / size:g}{unit}"
    return format_duration(seconds)


def _duration(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f'expected a duration like "30s", got {type(value).__name__}')
    seconds = parse_duration(value)
    if math.isnan(seconds) or seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is out of range (at most 100 years)")
    return seconds


def _positive_duration(value: Any) -> float:
    seconds = _duration(value)
    if seconds <= 0:
        raise ValueError(f"must be longer than zero, got {value!r}")
    return seconds


def _millis_duration(value: Any) -> float:
    seconds = _duration(value)
    if seconds > MAX_MILLIS_DURATION:
        raise ValueError(f"{value!r} is out of range (at most 24d: milliseconds in 32 bits)")
    return seconds


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


def _idle_timeout(value: Any) -> float:
    seconds = _positive_duration(value)
    if not 60 <= seconds <= 12 * 3600:  # a login lasts 12 h at most anyway
        raise ValueError(f"must be from 1m to 12h, got {value!r}")
    return seconds


def _every(value: Any) -> float:
    seconds = _positive_duration(value)
    if seconds < 1 or seconds != int(seconds):
        raise ValueError(f"must be whole seconds, at least 1s, got {value!r}")
    return seconds


def _retention(value: Any) -> float | None:
    """A retention: a duration, or "off" (or 0) to keep forever."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    seconds = _duration(value)
    if seconds < 0:
        raise ValueError(f'must be a duration >= 0 or "off", got {value!r}')
    return None if seconds == 0 else seconds


duration = Check(_duration, "a duration, at most 100 years", duration_text)
positive_duration = Check(_positive_duration, "a duration longer than zero", duration_text)
millis_duration = Check(_millis_duration, "a duration, at most 24d", duration_text)
positive_millis_duration = Check(
    lambda v: _positive_duration(_millis_duration(v)),
    "a duration longer than zero, at most 24d",
    duration_text,
)
stop_grace = Check(_stop_grace, "a duration from 0 to 1d", duration_text)
idle_timeout = Check(_idle_timeout, "a duration from 1m to 12h", duration_text)
every = Check(_every, "a duration in whole seconds, at least 1s", duration_text)


def _dedupe_window(value: Any) -> float:
    seconds = _positive_duration(value)
    if seconds > DEDUPE_WINDOW_MAX_SECONDS:
        raise ValueError(f"must be at most 365d, got {value!r}")
    return seconds


dedupe_window = Check(_dedupe_window, "a duration longer than zero, at most 365d", duration_text)
retention = Check(
    _retention,
    'a duration, or "off" (or 0) to keep forever',
    duration_text,
    unset="off",
)


# -- sizes -----------------------------------------------------------------------------------


def size_text(size: int) -> str:
    """A size as written in the file: "1MiB", "64KiB", or bytes."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f'expected a size like "2GiB", got {describe(value)}')
    return parse_size(value)


size = Check(
    _size, 'a size like "2GiB" or "512MiB" (binary units; GB means GiB), 1MiB to 1PiB', size_text
)

# The bounds of [logs] max_bytes_per_attempt: less is a typo; more would make every
# running attempt's once-a-second write of its tail heavy (README "Job logs").
LOG_CAP_MIN = 4 << 10
LOG_CAP_MAX = 64 << 20


def _log_cap(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(f'expected a size like "1MiB", got {describe(value)}')
    return parse_size(value, minimum=LOG_CAP_MIN, maximum=LOG_CAP_MAX)


log_cap = Check(
    _log_cap, f"a size from {size_text(LOG_CAP_MIN)} to {size_text(LOG_CAP_MAX)}", size_text
)


# -- lists, names, addresses -----------------------------------------------------------------


def _string_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"expected a list of non-empty strings, got {describe(value)}")
    return tuple(value)


def _as_list(value: Any) -> Any:
    return list(value)


# the bounds enqueue applies: a queue no job can be enqueued in would never run anything
queue_names = Check(
    lambda v: tuple(check_name("queue", q) for q in _string_list(v)),
    "a list of queue names",
    _as_list,
)

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


exception_type_names = Check(
    _exception_type_names,
    f"a list of at most {MAX_NO_RETRY} qualified exception type names",
    _as_list,
)


def _target(value: Any) -> str:
    text = _string(value)
    module, sep, function = text.partition(":")
    ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
    if not sep or not all(ident.match(p) for p in module.split(".")) or not ident.match(function):
        raise ValueError(f'expected "package.module:function", got {text!r}')
    return text


target = Check(_target, '"package.module:function", importable on this host')


def _optional_target(value: Any) -> str:
    return "" if _string(value) == "" else _target(value)


# [tracing] provider: a target, or empty for the default
optional_target = Check(_optional_target, '"package.module:function", or empty')

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


def uid_range_text(uids: tuple[int, int]) -> str:
    return "{}-{}".format(*uids)


uid_range = Check(
    _uid_range,
    f'a uid range "FIRST-LAST" within {JOB_UID_MIN}-{JOB_UID_MAX}',
    uid_range_text,
)

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


listen = Check(_listen, '"HOST:PORT", "[IPV6]:PORT" or ":PORT" (every interface); or empty')


def _bind(value: Any) -> str:
    text = _nonempty(value)
    if not _HOST_RE.match(text) and not re.fullmatch(r"[0-9A-Fa-f:.]+", text):
        raise ValueError(f"expected a host name or an IP address, got {describe(value)}")
    return text


bind = Check(_bind, "a host name or an IP address")


def _ip_address(value: Any) -> str:
    import ipaddress

    text = _string(value)
    if text:
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(f"expected an IP address, got {describe(value)}") from None
    return text


ip_address = Check(_ip_address, "an IP address, or empty")


# -- schedules -------------------------------------------------------------------------------


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


def _payload(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a table (a JSON object), got {describe(value)}")
    return value


cron = Check(_cron, "a cron expression: 5 fields, or 6 with seconds first")
timezone = Check(_timezone, 'an IANA time zone name ("Europe/Berlin")')
payload = Check(_payload, "a table (a JSON object)")


# -- fair share and start-rate limits (claim_v4, schema 33) ----------------------------------

RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
RATE_MAX_PER_SECOND = 1_000_000.0  # claim_v4 refuses more: no claim starts jobs that fast
_RATE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)/([a-z]+)$")


@dataclass(frozen=True)
class Rate:
    """A start rate as written ("20/m": 20 starts a minute) and in starts per second."""

    count: float
    unit: str

    @property
    def per_second(self) -> float:
        return self.count / RATE_UNITS[self.unit]

    def __str__(self) -> str:
        return f"{self.count:g}/{self.unit}"


def _rate(value: Any) -> Rate:
    text = _string(value).strip()
    match = _RATE_RE.match(text)
    if match is None:
        raise ValueError(
            f'expected starts per unit such as "20/m" (a plain decimal number, then /s, /m '
            f"or /h), got {describe(value)}"
        )
    count, unit = float(match[1]), match[2]
    if unit not in RATE_UNITS:
        raise ValueError(f"unknown unit {unit!r} in {text!r}: use s, m or h")
    rate = Rate(count, unit)
    if not count > 0:
        raise ValueError(f"must be above 0 (no start at all is a pause), got {text!r}")
    if not rate.per_second <= RATE_MAX_PER_SECOND:
        raise ValueError(f"must be at most {RATE_MAX_PER_SECOND:g} starts a second, got {text!r}")
    return rate


rate = Check(_rate, 'starts per unit: "20/m" (units s, m, h; above 0, at most 1000000/s)', str)

FAIR_WEIGHT_MAX = 1000  # jobs of one key per turn
FAIR_WEIGHTS_MAX = 10_000  # keys with a weight (the rest weigh 1)


def _fair_weights(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a table of concurrency keys and weights, got {describe(value)}")
    if len(value) > FAIR_WEIGHTS_MAX:
        raise ValueError(f"at most {FAIR_WEIGHTS_MAX} keys may have a weight, got {len(value)}")
    weights = {}
    for name, weight in value.items():
        if not (0 < len(name) <= 128 and name.isprintable() and name == name.strip()):
            raise ValueError(
                f"{describe(name)} is not a concurrency key (1 to 128 printable characters, "
                "no whitespace at either end)"
            )
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise TypeError(
                f"the weight of {name!r} must be a whole number from 1 to {FAIR_WEIGHT_MAX} "
                f"(jobs per turn), got {describe(weight)}"
            )
        if not 1 <= weight <= FAIR_WEIGHT_MAX:
            raise ValueError(
                f"the weight of {name!r} must be from 1 to {FAIR_WEIGHT_MAX} (jobs per "
                f"turn), got {weight}"
            )
        weights[name] = weight
    return weights


fair_weights = Check(
    _fair_weights,
    f"a table of concurrency keys and whole numbers from 1 to {FAIR_WEIGHT_MAX} "
    f"(at most {FAIR_WEIGHTS_MAX} keys)",
)

"""What enqueue accepts: the bounds of a job's fields, in one place for Python.

The SQL functions (migration 0004: enqueue, enqueue_many, enqueue_reject) enforce the same
bounds with the same messages; these let Python callers and the CLI refuse early, without
a round trip or an aborted transaction. Change both together.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime

# run_at: finite, 1900-01-01 <= run_at < 9000-01-01 (UTC). psycopg loads timestamps into
# Python datetimes, which end at year 9999 and, shifted into some time zones, fail near
# the ends of that range: a row psycopg cannot load would break every reader of the table.
RUN_AT_MIN = datetime(1900, 1, 1, tzinfo=UTC)
RUN_AT_MAX = datetime(9000, 1, 1, tzinfo=UTC)  # excluded
RUN_AT_RANGE = "from 1900-01-01 up to (not including) 9000-01-01 UTC"

# priority is stored as integer but bounded like a smallint: "lower runs sooner", and
# -2^31 must not become a way to jump every queue forever.
PRIORITY_MIN, PRIORITY_MAX = -32768, 32767
# Enough for any retry policy; 2^31-1 would mean a job that never dies.
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX = 1, 1000

NAME_MAX_CHARS = 128
DEDUPE_KEY_MAX_CHARS = 512
# Dependencies and deadlines (schema 27, enqueue_many_v3's job_extras_problem): at most
# this many parents per job; the choices of on_parent_failure; a job's own timeout above 0
# and at most 365 days; expire_in above 0 and at most 100 years.
PARENTS_MAX = 1000
ON_PARENT_FAILURE = ("cancel", "run", "hold")
TIMEOUT_MAX_SECONDS = 365 * 86400
EXPIRE_IN_MAX_SECONDS = 36525 * 86400
# Dedupe windows and policies (schema 34, job_extras_problem): a window, a debounce and
# its cap each above 0 and at most 365 days; the policies of a dedupe hit.
DEDUPE_WINDOW_MAX_SECONDS = 365 * 86400
DEDUPE_POLICIES = ("existing", "reject", "debounce")
# A payload's values may lie at most this many levels below it (the payload is level 0):
# enqueue_valid (migration 0008) refuses `$.**{256 to last}`, a child's frame no deeper.
PAYLOAD_DEPTH_MAX = 255


def payload_too_deep(payload: object) -> bool:
    """Whether some value lies more than PAYLOAD_DEPTH_MAX levels below `payload` (walked
    without recursion: a hostile value may be nested far deeper than Python's stack)."""
    stack = [(payload, 0)]
    while stack:
        value, level = stack.pop()
        if level > PAYLOAD_DEPTH_MAX:
            return True
        if isinstance(value, dict):
            stack.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list | tuple):
            stack.extend((v, level + 1) for v in value)
    return False


# Characters refused anywhere in a handler or queue name: they are printed by `jobs`,
# `status`, `show` and the logs, where they would move the cursor, rewrite lines or
# reorder text. C0, DEL, C1, the line/paragraph separators and the bidi controls.
# (Kept equal to _NAME_CONTROL in sql/migrations/0004_trust.sql.)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Whitespace a name may not begin or end with (the Unicode spaces that are not controls,
# listed explicitly so that PostgreSQL and Python agree whatever the locale).
_SPACE = " \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u202f\u205f\u3000"


def name_problem(what: str, value: object) -> str | None:
    """Why `value` cannot be a handler or queue name (`what` names it), or None."""
    if not isinstance(value, str) or not value:
        return f"{what} must be a non-empty string"
    if len(value) > NAME_MAX_CHARS:
        return f"{what} must be at most {NAME_MAX_CHARS} characters, not {len(value)}"
    bad = _CONTROL.search(value)
    if bad:
        return f"{what} must not contain control characters (found U+{ord(bad[0]):04X})"
    if not value.strip(_SPACE):
        return f"{what} must not be blank"
    if value[0] in _SPACE or value[-1] in _SPACE:
        return f"{what} must not begin or end with whitespace"
    return None


# A batch of 10,000 jobs names a handful of handlers and queues: each pair is checked once
# (enqueue_many's Python side costs about 1 us per job; this keeps the names' share small).
@functools.lru_cache(maxsize=1024)
def job_names_problem(handler: str, queue: str) -> str | None:
    """name_problem of a job's handler, then of its queue (both strings)."""
    return name_problem("handler", handler) or name_problem("queue", queue)


def check_name(what: str, value: object) -> str:
    """`value` if it is a valid handler or queue name; ValueError saying why not."""
    problem = name_problem(what, value)
    if problem:
        raise ValueError(problem)
    assert isinstance(value, str)
    return value


# Batches (schema 30, batch_enqueue): at most this many member jobs per batch; a callback is
# handed the outcomes of its batch's first BATCH_OUTCOMES members by id (job.batch: read by
# the claim, claim_jobs_v3, which holds the same figure), and pages the rest with
# batch_members_page (at most BATCH_PAGE_MAX a page).
BATCH_MEMBERS_MAX = 100_000
BATCH_OUTCOMES = 100
BATCH_PAGE_MAX = 1000


# A job's trace context (schema 35, enqueue_many_v3's "trace"; job_trace_problem in
# sql/objects/enqueue.sql says the same with the same messages): W3C traceparent in
# version 00's form, not version ff, neither id all zeros; tracestate at most this many
# printable ASCII characters (the W3C's recommended limit for a propagated tracestate).
TRACESTATE_MAX_CHARS = 512
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE = re.compile(r"[\x20-\x7e]*")


def trace_problem(trace: object) -> str | None:
    """What is wrong with a job's trace context ({"traceparent", "tracestate"}), None:
    nothing."""
    if not isinstance(trace, dict):
        return 'trace must be an object of "traceparent" and "tracestate"'
    unknown = sorted(k for k in trace if k not in ("traceparent", "tracestate"))
    if unknown:
        return (
            f'trace has an unknown key "{str(unknown[0])[:100]}" (known: traceparent, tracestate)'
        )
    parent = trace.get("traceparent")
    if (
        not isinstance(parent, str)
        or not _TRACEPARENT.fullmatch(parent)
        or parent.startswith("ff")
        or parent[3:35] == "0" * 32
        or parent[36:52] == "0" * 16
    ):
        return (
            "trace.traceparent must be a W3C traceparent (such as "
            '"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), not '
            f"{'none' if parent is None else repr(str(parent)[:100])}"
        )
    if "tracestate" in trace:
        state = trace["tracestate"]
        if (
            not isinstance(state, str)
            or len(state) > TRACESTATE_MAX_CHARS
            or not _TRACESTATE.fullmatch(state)
        ):
            return (
                f"trace.tracestate must be at most {TRACESTATE_MAX_CHARS} printable ASCII "
                f"characters, not {str(state)[:100]!r}"
            )
    return None

"""The parent<->child protocol: every message either side sends, typed, and the one place
where messages become frames and frames become messages again.

Dependency-free (the child imports it; it must not load database code). A frame is a
4-byte length and a JSON object whose "t" names the kind (pgworkerd.worker.wire).

Child -> parent: Hello (once, first), then per job Started, any number of Beat and Usage,
and one report: Done, Failed or Interrupted.
Parent -> child: Job, LeaseExtended, Cancel, Shutdown (finish or stop the current job,
then exit), Exit (exit when idle). Parent -> the child's watcher (its own socket): Watch
(what the fence needs of each job) and LeaseExtended.

decode() checks what it is given: the parent reads children that run arbitrary handler
code, so a message of an unknown kind, with a missing field or a field of the wrong type
raises ProtocolError (the parent then stops that child; nothing else is affected).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from pgworkerd.worker.wire import encode as encode_frame


class Kind(StrEnum):
    HELLO = "hello"
    STARTED = "started"
    BEAT = "beat"
    DONE = "done"
    FAILED = "error"
    INTERRUPTED = "interrupted"
    USAGE = "usage"
    JOB = "job"
    LEASE_EXTENDED = "lease"
    CANCEL = "cancel"
    SHUTDOWN = "shutdown"
    EXIT = "exit"
    OUTPUT = "output"
    STOP = "stop"
    WATCH = "watch"


class ProtocolError(ValueError):
    """A message that is not one of the protocol's, or not well-formed."""


# -- child -> parent ---------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    kind: ClassVar[Kind] = Kind.HELLO
    pid: int


@dataclass(frozen=True)
class Started:
    kind: ClassVar[Kind] = Kind.STARTED
    id: int


@dataclass(frozen=True)
class Beat:
    """The job is alive; progress and checkpoint are None when not given."""

    kind: ClassVar[Kind] = Kind.BEAT
    id: int | None = None  # the job; None from a child of release 0.2 (its current job)
    progress: Any = None
    checkpoint: Any = None


@dataclass(frozen=True)
class Done:
    kind: ClassVar[Kind] = Kind.DONE
    id: int
    result: Any = None
    # Follow-up jobs the handler returned (pgworkerd.Done(result, then=[...])): each the
    # JSON object enqueue_many_v3 takes; None: none. A parent of release 0.2 ignores it.
    # Checked here as a list of at most MAX_FOLLOW_UPS objects; the daemon and the
    # database check the jobs themselves.
    then: list[Any] | None = None


@dataclass(frozen=True)
class Failed:
    """The handler raised (or its outcome could not be sent whole)."""

    kind: ClassVar[Kind] = Kind.FAILED
    id: int
    error: str
    traceback: str = ""
    # The outcome the handler chose (pgworkerd.worker.outcomes), as optional fields a
    # parent of release 0.2 ignores (it reads the frame as the failure `error` says):
    snooze: float | None = None  # Snooze: seconds until the job runs again
    give_up: str | None = None  # GiveUp: the reason
    # the raised exception's qualified type names along its MRO, for a handler's no_retry
    exception_types: list[str] | None = None
    # WaitFor: {"name": ..., "timeout": seconds, "key": ... or null}, checked by the daemon
    wait: Any = None


@dataclass(frozen=True)
class Interrupted:
    """The handler ended with JobInterrupted: stopped by the daemon or by itself."""

    kind: ClassVar[Kind] = Kind.INTERRUPTED
    id: int
    error: str
    traceback: str = ""


@dataclass(frozen=True)
class Usage:
    """What the job's process tree cost so far (pgworkerd.worker.resources): sent before
    each report, and while the job runs whenever its peak memory grew."""

    kind: ClassVar[Kind] = Kind.USAGE
    id: int
    cpu_user: float  # seconds
    cpu_system: float
    peak_memory: int  # bytes, the tree's
    child_memory: int  # bytes, the child process's own now (max_child_memory)


@dataclass(frozen=True)
class Output:
    """What a job running as one of a child's concurrent coroutines printed or logged
    (Python-level: print, sys.stdout/sys.stderr, logging), attributed to it by its
    context (pgworkerd.worker.aiosession); the daemon adds it to the job's log."""

    kind: ClassVar[Kind] = Kind.OUTPUT
    id: int
    text: str


Report = Done | Failed | Interrupted


# -- parent -> child ---------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    kind: ClassVar[Kind] = Kind.JOB
    id: int
    handler: str
    target: str  # "module:function"
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    checkpoint: Any
    deadline: float  # time.monotonic() when the lease runs out (as last renewed)
    memory_limit: int | None = None  # bytes, the job's whole process tree
    # its parents' results by parent id as text (schema 27); None: it has no parents
    parents: Any = None
    # What woke a job that waited (WaitFor): {"name": the wait's signal name, "ended":
    # "signal" or "timeout", "payload": the signal's, "sent_at": ISO time}; None: never
    # waited
    woken: Any = None
    # The attempt's lease token (job.lease_token: a capability for job_lease_assert in
    # the application's own transaction); never logged or shown.
    lease_token: int | None = None
    # A batch callback's batch (schema 30): {"id", "members", "completed", "dead",
    # "cancelled", "outcomes": [{"id", "status", "result", "error"}, ...] (the first 100
    # members by id), "outcomes_complete": bool}; None: not a batch's callback
    batch: Any = None
    # The handler's concurrency when above 1 (an async handler whose jobs this child runs
    # side by side: pgworkerd.worker.aiosession); None: one job at a time
    concurrency: int | None = None
    # The enqueuer's W3C trace context (schema 35, pgworkerd.tracing): {"traceparent",
    # "tracestate"}; sent only while [tracing] is enabled; None: none
    trace: Any = None


@dataclass(frozen=True)
class LeaseExtended:
    kind: ClassVar[Kind] = Kind.LEASE_EXTENDED
    deadline: float
    id: int | None = None  # the job it is for: one that ended already ignores it


@dataclass(frozen=True)
class Cancel:
    kind: ClassVar[Kind] = Kind.CANCEL
    id: int | None = None  # the job it is for: one that ended already ignores it


@dataclass(frozen=True)
class Shutdown:
    kind: ClassVar[Kind] = Kind.SHUTDOWN
    # None: the daemon is leaving (SIGTERM): every job of this child is asked to stop. An
    # id: only that job is (a hand-back, after which the child runs other jobs).
    id: int | None = None


@dataclass(frozen=True)
class Exit:
    kind: ClassVar[Kind] = Kind.EXIT


@dataclass(frozen=True)
class Stop:
    """Stop this one job (cancel its coroutine) in a child that runs jobs side by side:
    what a SIGTERM to the child's group is for a child that runs one job."""

    kind: ClassVar[Kind] = Kind.STOP
    id: int


# -- parent -> the child's watcher (pgworkerd.worker.watcher) -----------------------------


@dataclass(frozen=True)
class Watch:
    """What the fence needs of a job handed to the watcher's child, sent beside its Job:
    never the payload or anything else the enqueuer wrote, which the watcher (root's, if
    the daemon is) then neither receives nor parses, and a large job is not written
    twice."""

    kind: ClassVar[Kind] = Kind.WATCH
    id: int
    attempt: int
    deadline: float  # as Job.deadline
    memory_limit: int | None = None  # as Job.memory_limit
    concurrency: int | None = None  # as Job.concurrency: side by side, no cgroup each

    @classmethod
    def of(cls, job: Job) -> Watch:
        return cls(job.id, job.attempt, job.deadline, job.memory_limit, job.concurrency)


ChildMessage = Hello | Started | Beat | Done | Failed | Interrupted | Usage | Output
ParentMessage = Job | LeaseExtended | Cancel | Shutdown | Exit | Stop
WatcherMessage = Watch | LeaseExtended
Message = ChildMessage | ParentMessage | WatcherMessage

_CLASSES: dict[str, type[Any]] = {
    cls.kind.value: cls
    for cls in (
        Hello,
        Started,
        Beat,
        Done,
        Failed,
        Interrupted,
        Usage,
        Job,
        LeaseExtended,
        Cancel,
        Shutdown,
        Exit,
        Output,
        Stop,
        Watch,
    )
}
# Fields that hold any JSON value; every other field's type is checked.
_ANY = {
    "progress",
    "checkpoint",
    "result",
    "payload",
    "parents",
    "wait",
    "woken",
    "batch",
    "trace",
}
_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "int | None": (int, type(None)),
    "str": (str,),
    "float": (int, float),
    "float | None": (int, float, type(None)),
    "str | None": (str, type(None)),
}
# Each kind's fields, looked up once (dataclasses.fields per message was a tenth of the
# parent's time per short job): for encode, (name, left out when None); for decode,
# (name, required, the types it accepts or None for any JSON value, its declared type).
_ENCODED: dict[type[Any], tuple[tuple[str, bool], ...]] = {
    cls: tuple((f.name, f.default is None) for f in dataclasses.fields(cls))
    for cls in _CLASSES.values()
}
_DECODED: dict[type[Any], tuple[tuple[str, bool, tuple[type, ...] | None, str], ...]] = {
    cls: tuple(
        (
            f.name,
            f.default is dataclasses.MISSING,
            None
            if f.name in _ANY or f.name in ("exception_types", "then")
            else _TYPES[str(f.type)],
            str(f.type),
        )
        for f in dataclasses.fields(cls)
    )
    for cls in _CLASSES.values()
}
# At most this many exception type names of at most this many characters each.
MAX_TYPE_NAMES = 64
MAX_TYPE_NAME_LENGTH = 512


def encode(message: Message) -> bytes:
    """One frame; raises wire.FrameTooLarge, or ValueError/TypeError for a value JSON
    cannot carry (callers decide what that costs: the job, never the loop)."""
    body: dict[str, Any] = {"t": message.kind.value}
    for name, optional in _ENCODED[type(message)]:
        value = getattr(message, name)  # shallow: a payload is not copied
        if value is None and optional:
            continue  # left out, as release 0.2 did: to it a key means a value
        body[name] = value
    return encode_frame(body)


def decode(obj: Any) -> Message:
    """The message a decoded JSON frame holds; ProtocolError if it is not one."""
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message must be a JSON object, not {type(obj).__name__}")
    cls = _CLASSES.get(obj.get("t"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown message kind {str(obj.get('t'))[:40]!r}")
    values: dict[str, Any] = {}
    for name, required, wanted, declared in _DECODED[cls]:
        if name not in obj:
            if required:
                raise ProtocolError(f"{cls.kind.value} message without {name!r}")
            continue
        value = obj[name]
        if name == "exception_types":
            _check_type_names(value)
        elif name == "then":
            _check_follow_ups(value)
        elif wanted is not None and (isinstance(value, bool) or not isinstance(value, wanted)):
            raise ProtocolError(
                f"{cls.kind.value} message: {name!r} is {type(value).__name__}, not {declared}"
            )
        values[name] = value
    return cls(**values)


# At most this many follow-up jobs per completion (the database refuses more too:
# jobs_complete_with_follow_ups).
MAX_FOLLOW_UPS = 1000


def _check_follow_ups(value: Any) -> None:
    """then: null, or a list of at most MAX_FOLLOW_UPS JSON objects."""
    if value is None:
        return
    if (
        not isinstance(value, list)
        or len(value) > MAX_FOLLOW_UPS
        or not all(isinstance(v, dict) for v in value)
    ):
        raise ProtocolError(
            f"done message: 'then' must be a list of at most {MAX_FOLLOW_UPS} job objects"
        )


def _check_type_names(value: Any) -> None:
    """exception_types: null, or a bounded list of bounded strings."""
    if value is None:
        return
    if (
        not isinstance(value, list)
        or len(value) > MAX_TYPE_NAMES
        or not all(isinstance(v, str) and len(v) <= MAX_TYPE_NAME_LENGTH for v in value)
    ):
        raise ProtocolError(
            f"error message: 'exception_types' must be a list of at most {MAX_TYPE_NAMES} "
            f"names of at most {MAX_TYPE_NAME_LENGTH} characters"
        )

"""Outcomes a handler chooses by raising: Snooze ("run me again in N seconds; this was not
a failure") and GiveUp ("dead now, with this reason"), or by returning: Done ("completed
with this result, and enqueue these follow-up jobs in the same transaction"). Child side
and dependency-free: handlers import them as pgworkerd.Snooze / pgworkerd.GiveUp /
pgworkerd.Done (or from pgworkerd.child).

The child reports them as a failure with optional fields (protocol.Failed.snooze,
.give_up), so a daemon of release 0.2 records them as an ordinary failed attempt; the
daemon decides what they mean (daemon.outcomes.decide), checking the values again: a
child runs arbitrary code and its messages are not trusted.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from pgworkerd.bounds import name_problem
from pgworkerd.durations import parse_duration

# The longest snooze a handler may ask for: 30 days. Longer is a handler error (the
# attempt fails, saying why): a job that must wait longer is better enqueued with run_at.
MAX_SNOOZE_SECONDS = 30 * 86400.0


class Snooze(Exception):
    """Raise in a handler to run the job again in `seconds` (0 to MAX_SNOOZE_SECONDS):
    back to pending, the attempt not counted, the job's snooze count raised by one. A
    handler's `max_snoozes` bounds how often one job may snooze; beyond it a snooze is
    recorded as a failed attempt."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds

    def __str__(self) -> str:
        return f"run again in {self.seconds!r}s"


class GiveUp(Exception):
    """Raise in a handler to end the job as dead now, whatever attempts are left, with
    `reason` as its last_error."""

    def __init__(self, reason: str = "the handler gave up") -> None:
        super().__init__(reason)
        self.reason = str(reason)

    def __str__(self) -> str:
        return self.reason


class Done:
    """Return it from a handler to complete the job with `result` and enqueue the jobs of
    `then` (pgworkerd.JobSpec, at most 1000) in the same transaction as the completion:
    a holder whose lease was lost inserts none of them, and a job's follow-ups are
    inserted exactly once (docs/guide/follow-ups.md). A list that is not a list of JobSpec,
    an invalid job, or more than 1000 make the attempt fail, saying why (retried like any
    failure); so does a list the database refuses (its checks and the enqueue bounds)."""

    __slots__ = ("result", "then")

    def __init__(self, result: Any = None, then: Any = ()) -> None:
        self.result = result
        self.then = then

    def __repr__(self) -> str:
        return f"Done(result={self.result!r}, then=<{_count(self.then)} follow-ups>)"


def _count(then: Any) -> str:
    try:
        return str(len(then))
    except TypeError:
        return "?"


def follow_ups_json(then: Any, limit: int) -> list[dict[str, Any]]:
    """The follow-ups of a Done as enqueue_many_v3's job objects (a JobSpec in another's
    `after` is an earlier follow-up of the same list, sent as its position, after_index);
    raises ValueError saying what is wrong (not a list or tuple of JobSpec, more than
    `limit`, an invalid job)."""
    if isinstance(then, str | bytes | dict) or not isinstance(then, list | tuple):
        raise ValueError(
            f"Done(then=...) must be a list of pgworkerd.JobSpec, not {type(then).__name__}"
        )
    if len(then) > limit:
        raise ValueError(f"Done(then=...) holds {len(then)} follow-ups; at most {limit}")
    if not then:
        return []
    # A JobSpec exists only once its module is loaded (by the handler that built it):
    # looked up, not imported, so the child side loads no database code.
    client = sys.modules.get("pgworkerd.client")
    for n, spec in enumerate(then, 1):
        if client is None or not isinstance(spec, client.JobSpec):
            raise ValueError(
                f"follow-up {n} of {len(then)} must be a pgworkerd.JobSpec, "
                f"not {type(spec).__name__}"
            )
    assert client is not None  # (a JobSpec was found above)
    try:
        jobs: list[dict[str, Any]] = json.loads(client.jobs_json(then, client.ambient_trace()))
    except client.InvalidJob as exc:  # "job N: why", N counted from 1 as here
        at, _, why = str(exc).removeprefix("job ").partition(": ")
        raise ValueError(f"follow-up {at} of {len(then)}: {why}") from None
    return jobs


def snooze_problem(seconds: Any) -> str | None:
    """Why `seconds` is not a snooze a job may take (None: it is). Asked in the child and
    again in the daemon."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return f"Snooze seconds must be a number, not {type(seconds).__name__}"
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SNOOZE_SECONDS:
        return (
            f"Snooze seconds must be from 0 to {MAX_SNOOZE_SECONDS:.0f} (30 days), not {seconds!r}"
        )
    return None


# What the child reports of the raised exception's type for `no_retry`: the qualified
# names along its MRO (most derived first), at most this many.
MAX_EXCEPTION_TYPES = 64


def exception_types(exc: BaseException) -> list[str]:
    """The qualified names ("module.QualName"; builtins as just "QualName") of the
    exception's type and every class it derives from, most derived first."""
    names = []
    for cls in type(exc).__mro__[:MAX_EXCEPTION_TYPES]:
        module = getattr(cls, "__module__", "") or ""
        qualname = getattr(cls, "__qualname__", cls.__name__)
        names.append(qualname if module == "builtins" else f"{module}.{qualname}")
    return names


# The longest wait a handler may ask for (WaitFor's timeout): 366 days, as job_suspend
# (finish.sql, migration 0028) checks again.
MAX_WAIT_SECONDS = 366 * 86400.0


class WaitFor(Exception):
    """Raise in a handler to suspend its job until signal `name` comes (`pgworkerd signal
    ID NAME`, pgworkerd.signal, signal_send in SQL) or `timeout` passes ("2d", "30m",
    seconds; above 0, at most 366 days): the checkpoint (`checkpoint` if given, else the
    handler's last heartbeat checkpoint) is saved, the attempt is not counted, the lease
    and the slot are let go and no process is kept. The next attempt starts from the
    checkpoint and sees what woke it: `job.signal` (its name and payload), None after the
    timeout. A signal of that name sent earlier makes the wait return at once (the job is
    pending again without waiting). `key`, a correlation key (like a handler name), lets a
    sender that does not know the job's id reach it (`pgworkerd signal --key KEY NAME`);
    one live job per key. A bad name, timeout or key is a failed attempt that says why."""

    def __init__(
        self,
        name: str,
        timeout: str | float | int = "1d",
        key: str | None = None,
        checkpoint: Any = None,
    ) -> None:
        super().__init__(name, timeout, key)
        self.name = name
        self.timeout = timeout
        self.key = key
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        key = f" (key {self.key!r})" if self.key is not None else ""
        return f"wait for signal {self.name!r}{key}, at most {self.timeout!r}"


def wait_problem(name: Any, timeout: Any, key: Any) -> tuple[str | None, float]:
    """(why a WaitFor is not one a job may take or None, its timeout in seconds). Asked in
    the child and again in the daemon (a child runs arbitrary code)."""
    problem = name_problem("WaitFor name", name)
    if problem is not None:
        return problem, 0.0
    if key is not None:
        problem = name_problem("WaitFor key", key)
        if problem is not None:
            return problem, 0.0
    try:
        seconds = parse_duration(timeout) if isinstance(timeout, str | int | float) else None
    except ValueError as exc:
        return f"WaitFor timeout: {exc}", 0.0
    if seconds is None:
        return f"WaitFor timeout must be a duration, not {type(timeout).__name__}", 0.0
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_WAIT_SECONDS:
        return (
            f"WaitFor timeout must be above 0 and at most {MAX_WAIT_SECONDS:.0f}s (366 days), "
            f"not {timeout!r}"
        ), 0.0
    return None, seconds

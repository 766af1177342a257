"""Handlers that choose their job's outcome (pgworkerd.Snooze, pgworkerd.GiveUp, no_retry),
for tests/integration/test_handler_outcomes.py; imported by the daemon's children through
PYTHONPATH. They raise through the package face, as users' handlers do."""

from __future__ import annotations

import time
from typing import Any

import pgworkerd
from pgworkerd.worker import JobContext


class PermanentError(Exception):
    """Named in a handler's no_retry by its qualified name."""


class CustomerGone(PermanentError):
    """A subclass: no_retry matches along the MRO."""


def snooze_then_done(job: JobContext) -> dict[str, Any]:
    """Snoozes payload["times"] times for payload["seconds"] each, then returns how long
    the last snooze lasted and which attempt it is (the checkpoint carries the count)."""
    done = job.checkpoint or {"n": 0, "at": None}
    if done["n"] < job.payload["times"]:
        job.heartbeat(checkpoint={"n": done["n"] + 1, "at": time.time()})
        raise pgworkerd.Snooze(job.payload["seconds"])
    return {"n": done["n"], "waited": time.time() - done["at"], "attempt": job.attempt}


def snooze_always(job: JobContext) -> None:
    raise pgworkerd.Snooze(job.payload["seconds"])


def give_up(job: JobContext) -> None:
    raise pgworkerd.GiveUp(job.payload["reason"])


_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "UnicodeError": UnicodeError,  # a subclass of ValueError
    "PermanentError": PermanentError,
    "CustomerGone": CustomerGone,
    "RuntimeError": RuntimeError,
}


def raise_named(job: JobContext) -> None:
    raise _ERRORS[job.payload["error"]](f"raised {job.payload['error']}")

"""The daemon's named states: of the daemon itself, of why it stopped a job, and of what a
finished attempt leaves. StrEnums: their values are what logs, metrics labels and the
registry show."""

from __future__ import annotations

from enum import StrEnum


class DaemonState(StrEnum):
    STARTING = "starting"  # until the database answers and the schema is checked
    RUNNING = "running"
    DRAINING = "draining"  # SIGTERM: no new claims; jobs finish until the drain timeout
    STOPPING = "stopping"  # second SIGTERM: every job stopped now and released

    @property
    def leaving(self) -> bool:
        return self in (DaemonState.DRAINING, DaemonState.STOPPING)


class RegistryState(StrEnum):
    """What a daemon's registry row says (pgworkerd status shows it)."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"  # a drain: jobs still in flight
    DRAINED = "drained"  # drained through the database: running, claiming nothing
    STOPPING = "stopping"
    GONE = "gone"  # exited, or marked gone by a peer after it stopped heartbeating


class StopReason(StrEnum):
    """Why the daemon stopped a job's child (None on an InFlight: it did not)."""

    DRAIN = "drain"  # the drain timeout passed, or it never started before a drain
    HAND_BACK = "hand back"  # `drain --hand-back`: its grace ended, or it never started
    TERMINATE = "terminate"
    NO_CHILD = "no child"  # claimed, but no child could be started for it in time
    TIMEOUT = "timeout"
    STUCK = "stuck"  # no heartbeat within heartbeat_timeout
    CANCEL = "cancel"
    LEASE_LOST = "lease lost"
    # killed with its child for another job of that child (an async handler's jobs run
    # side by side in one child: [handlers.X] concurrency)
    SIBLING = "sibling"

    @property
    def hands_back(self) -> bool:
        """The job goes back to the queue with its attempt not counted."""
        return self in (
            StopReason.DRAIN,
            StopReason.HAND_BACK,
            StopReason.TERMINATE,
            StopReason.NO_CHILD,
            StopReason.SIBLING,
        )


class OutcomeKind(StrEnum):
    COMPLETE = "complete"
    FAIL = "fail"  # retried after a backoff, or dead after its last attempt
    RELEASE = "release"  # handed back, attempt not counted
    CANCEL = "cancel"
    BURY = "bury"  # a row this daemon cannot run at all: dead at once
    # chosen by the handler (pgworkerd.worker.outcomes; no_retry)
    SNOOZE = "snooze"  # pending again after a delay, attempt not counted
    GIVE_UP = "give up"  # dead at once, with the handler's reason
    WAIT = "wait"  # suspended until a signal or its timeout, attempt not counted (WaitFor)

"""The import path handler modules used before pgworkerd.worker: kept so that one handler
module imports under this release and the previous one during a rolling upgrade."""

from pgworkerd.worker import GiveUp, JobContext, JobInterrupted, Snooze, WaitFor

__all__ = ["GiveUp", "JobContext", "JobInterrupted", "Snooze", "WaitFor"]

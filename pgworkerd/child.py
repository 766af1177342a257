"""The import path handler modules used before pgworkerd.worker: kept so that one handler
module imports under this release and the previous one during a rolling upgrade."""

from pgworkerd.worker import Done, GiveUp, JobContext, JobInterrupted, Snooze

__all__ = ["Done", "GiveUp", "JobContext", "JobInterrupted", "Snooze"]

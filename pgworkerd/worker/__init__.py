"""The child side: what a handler sees (JobContext, JobInterrupted), the child process
that runs one job at a time and the fork server that starts children. Nothing here
imports database code (a test holds it to that): children never touch the database."""

from pgworkerd.worker.child import JobContext, JobInterrupted, Signal
from pgworkerd.worker.outcomes import Done, GiveUp, Snooze, WaitFor

__all__ = ["Done", "GiveUp", "JobContext", "JobInterrupted", "Signal", "Snooze", "WaitFor"]

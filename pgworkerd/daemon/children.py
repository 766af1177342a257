"""What the parent's components need of a child process and of the supervisor that owns
them, as Protocols: the job table, the claimer and the accounting take these, so that
supervisor.Supervisor/Child and the unit tier's fakes (tests/support/fakes.py) are both
checked against them by mypy (which runs over tests/unit and tests/support too)."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from pgworkerd.worker.protocol import ParentMessage


class ChildProcess(Protocol):
    """One child: the job it runs, if any, and how to reach it."""

    job: int | None
    jobs_run: int
    exiting: bool  # told to exit, or will exit after its current job
    broken: str  # why the parent stopped it for a message it could not read
    rusage: Any  # os.wait4's, once reaped
    cpu_reported: tuple[float, float]  # (user, system) its settled jobs used

    @property
    def pid(self) -> int | None: ...

    def send(self, message: ParentMessage) -> bool: ...

    def signal_group(self, sig: int) -> None: ...


ChildT = TypeVar("ChildT", bound=ChildProcess)


class ChildSupervisor(Protocol[ChildT]):
    """The children: started, handed jobs, retired."""

    def idle(self) -> list[ChildT]: ...

    def starting(self) -> int: ...

    def can_start(self) -> bool: ...

    def spawn(self, count: int = 1) -> int: ...

    def retire(self, child: ChildT) -> None: ...

    def has_children(self) -> bool: ...

    def assign(
        self, child: ChildT, job_id: int, frame: bytes, watch_frame: bytes, side_by_side: int = 1
    ) -> None: ...

    def send_assigned(self) -> list[ChildT]: ...

    def unassign(self, child: ChildT, job_id: int) -> None: ...

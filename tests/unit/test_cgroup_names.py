"""Unit tier: the names of attempt cgroups ([worker] job_cgroups), which the daemon reads
back to find a dead child's cgroup: only its own names match, never the daemon's leaf or
a cgroup someone else made beside them."""

from __future__ import annotations

from pgworkerd.worker import cgroup


def test_an_attempt_cgroup_names_its_job_attempt_and_child() -> None:
    name = cgroup.attempt_name(42, 3, 12345)
    assert name == "job-42-a3-p12345"
    assert cgroup.child_pid_of(name) == 12345


def test_other_names_are_no_attempt_cgroups() -> None:
    for name in (cgroup.DAEMON_LEAF, "job-42-a3", "job-42-a3-p", "job-1-a1-pxyz", "other-p12"):
        assert cgroup.child_pid_of(name) is None, name

"""Fault tier: [worker] job_cgroups, one cgroup per attempt (issue 22 item 4), and the
daemon's log out of a job's reach.

The daemon starts in a real cgroup v2 directory made here as root on the unified
hierarchy and marked delegated the way systemd marks a Delegate=yes unit's
(`trusted.delegate`); tests/acceptance/test_systemd_dropins.py runs it under a real
systemd with dropin-job-cgroups.conf. No fake cgroup file system: the kernel's.

Not testable on these machines: memory.max and the OOM attribution (the memory
controller is bound to cgroup v1 here, so it can never be enabled on the v2 hierarchy).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import Daemons, Db, wait_for
from proctree import marked

from pgworkerd.daemon.cgroups import _unified_mount
from pgworkerd.worker import cgroup

HANDLERS = {
    name: {"target": f"cgrouphandlers:{name}", "max_attempts": 1}
    for name in ("escape", "probe_cgroup", "write_to_daemon_log")
}
# A reused child (max_jobs_per_child): its death, which makes the daemon sweep what it
# adopted, does not come right after the job.
WORKER = {"slots": 1, "warm_children": 0, "max_jobs_per_child": 5, "kill_grace": "2s"}
MOUNT = _unified_mount()
# Root without the capabilities that let it open any process's /proc files (these
# machines have their Python under /root, which a daemon of another user cannot run): a
# job of the daemon's own uid, as with an unprivileged daemon
WITHOUT_PTRACE = (
    "setpriv",
    "--inh-caps=-all",
    "--bounding-set=-sys_ptrace,-dac_override,-dac_read_search",
)
FIRST = 61500 + 16 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or MOUNT is None, reason="needs root and a cgroup v2 hierarchy"
)


def _remove_tree(path: Path) -> None:
    """Kill everything in a cgroup tree and remove it, deepest first."""
    for sub in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
        if sub.is_dir():
            cgroup.remove(str(sub))
    cgroup.remove(str(path))


@pytest.fixture
def delegated() -> Iterator[Path]:
    """A cgroup v2 directory delegated to the daemon (as systemd's Delegate=yes does)."""
    assert MOUNT is not None
    path = Path(MOUNT) / f"pgworkerd-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        os.setxattr(path, "trusted.delegate", b"1")
        yield path
    finally:
        _remove_tree(path)


@pytest.fixture
def open_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A TMPDIR job users may pass through (for the tests with job_uids)."""
    path = Path(tempfile.mkdtemp(prefix="pgworkerd-cgroups-", dir="/tmp"))
    path.chmod(0o711)
    monkeypatch.setenv("TMPDIR", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def private_config(daemons: Daemons, open_tmp: Path, worker: dict[str, Any]) -> Path:
    """A config only its owner reads (a daemon with job_uids refuses any other)."""
    path = open_tmp / f"pgworkerd-{uuid.uuid4().hex[:6]}.toml"
    daemons.config(HANDLERS, worker, path=path)
    path.chmod(0o600)
    return path


def attempt_cgroups(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.name.startswith(cgroup.PREFIX))


def test_an_escapee_the_tree_walk_misses_dies_with_the_attempts_cgroup(
    db: Db, daemons: Daemons, delegated: Path
) -> None:
    daemon = daemons.start(HANDLERS, WORKER, cgroup=str(delegated))
    daemon.wait_log("per-attempt cgroups under")
    marker = f"pgworkerd-test-{uuid.uuid4().hex}"
    job_id = db.enqueue("escape", {"marker": marker, "seconds": 2})
    escapees = wait_for(lambda: len(m := marked(marker)) == 2 and m, what="the escapees")
    for pid in escapees:  # in the attempt's cgroup
        with open(f"/proc/{pid}/cgroup") as f:
            assert f"/{delegated.name}/{cgroup.PREFIX}{job_id}-a1-p" in f.read()
    assert db.wait_status(job_id, "completed")["status"] == "completed"
    # Dead before the outcome was sent: not a moment later (the default, a tree walk and
    # a sweep when the daemon next reaps a process, lets it run on here)
    assert marked(marker) == []
    assert attempt_cgroups(delegated) == []  # removed after
    # the daemon and its processes in the leaf, none left in the delegated root
    assert cgroup.members(str(delegated)) == []
    assert daemon.pid in cgroup.members(str(delegated / cgroup.DAEMON_LEAF))


def test_without_cgroups_the_escapee_outlives_the_attempt(
    db: Db, daemons: Daemons, delegated: Path
) -> None:
    """What job_cgroups buys (and the test above's check failing without it)."""
    daemon = daemons.start(HANDLERS, {**WORKER, "job_cgroups": "off"}, cgroup=str(delegated))
    marker = f"pgworkerd-test-{uuid.uuid4().hex}"
    job_id = db.enqueue("escape", {"marker": marker, "seconds": 1})
    db.wait_status(job_id, "completed")
    assert marked(marker), "the escapee was gone at the outcome without a cgroup"
    assert not attempt_cgroups(delegated)
    daemon.stop()


def test_a_job_of_its_own_uid_cannot_leave_or_change_its_cgroup(
    db: Db, daemons: Daemons, delegated: Path, open_tmp: Path
) -> None:
    config = private_config(daemons, open_tmp, {**WORKER, "job_uids": f"{FIRST}-{FIRST + 3}"})
    daemons.start(config, cgroup=str(delegated))
    job_id = db.enqueue("probe_cgroup", {"mount": MOUNT})
    result: dict[str, Any] = db.wait_status(job_id, "completed", "failed")["result"]
    assert result is not None, db.job(job_id)
    own = f"/{delegated.name}/{cgroup.PREFIX}{job_id}-a1-p"
    assert result["cgroup"].startswith(own) and result["after"] == result["cgroup"]
    assert result["owner"] == 0  # the watcher's (root), not the job's
    for what in ("to daemon leaf", "to parent", "freeze", "subtree", "mkdir"):
        assert result[what] == "PermissionError", (what, result)
    assert attempt_cgroups(delegated) == []


def test_require_without_a_delegated_cgroup_refuses_to_start(daemons: Daemons) -> None:
    config = daemons.config(HANDLERS, {**WORKER, "job_cgroups": "require"})
    from daemon_harness import DaemonProcess

    daemon = DaemonProcess(
        daemons.dsn, daemons.schema, config, daemons.tmp_path / "daemon-R.log", "R"
    )
    daemons.started.append(daemon)
    daemon.start(wait_ready=False)
    assert daemon.wait_exit() == 3
    assert 'worker.job_cgroups = "require": ' in daemon.log()
    assert "not delegated" in daemon.log() or "root cgroup" in daemon.log()


@pytest.mark.parametrize("job_uids", [False, True], ids=["the daemon's uid", "job_uids"])
def test_a_job_cannot_write_into_the_daemons_log(
    db: Db, daemons: Daemons, open_tmp: Path, job_uids: bool
) -> None:
    """Found last session: the child kept the daemon's stdout and stderr (to put back
    between jobs), so a handler could write untagged lines into the daemon's log through
    them. And the daemon's own descriptors, /proc/DAEMON/fd/1 and 2, are out of a job's
    reach too: with a uid of its own, and with the daemon's (the daemon, its fork server
    and each child's watcher are not dumpable: their /proc files need CAP_SYS_PTRACE)."""
    if job_uids:
        config = private_config(
            daemons, open_tmp, {**WORKER, "job_uids": f"{FIRST + 4}-{FIRST + 7}"}
        )
        daemon = daemons.start(config)
    else:
        daemon = daemons.start(HANDLERS, WORKER, wrapper=WITHOUT_PTRACE)
    text = f"FORGED-{uuid.uuid4().hex}"
    log = daemon.log_path.stat()
    job_id = db.enqueue("write_to_daemon_log", {"text": text, "log": [log.st_dev, log.st_ino]})
    row = db.wait_status(job_id, "completed", "failed")
    assert row["status"] == "completed", row
    tried: dict[str, str] = row["result"]
    assert not [k for k, v in tried.items() if k.startswith("fd ")], tried  # none left
    assert {v for k, v in tried.items() if k.startswith("/proc/")} == {"PermissionError"}, tried
    time.sleep(1.5)  # (the daemon copies job output to its log about once a second)
    forged = [line for line in daemon.log().splitlines() if text in line]
    # what a job prints reaches the daemon's log tagged as that job's, never as its own
    assert all(f"job {job_id} attempt 1" in line for line in forged), forged
    with contextlib.suppress(Exception):
        daemon.stop()


@pytest.mark.parametrize("job_cgroups", ["auto", "off"])
def test_a_frozen_daemons_escapees_die_at_the_lease_deadline(
    db: Db, daemons: Daemons, delegated: Path, job_cgroups: str
) -> None:
    """The daemon frozen (no renewal, no sweep): the watcher stops the job at its lease
    deadline, and with the attempt's cgroup the escapees (the daemon's children now, out
    of every walk the watcher can make) die with it; without, they run on past the lease
    until the daemon thaws and sweeps. The attempt still says its lease ran out."""
    worker = {**WORKER, "lease": "4s", "renew_interval": "1s", "job_cgroups": job_cgroups}
    daemon = daemons.start(HANDLERS, worker, cgroup=str(delegated))
    marker = f"pgworkerd-test-{uuid.uuid4().hex}"
    job_id = db.enqueue("escape", {"marker": marker, "seconds": 600})
    wait_for(lambda: len(marked(marker)) == 2, what="the escapees")
    daemon.send(signal.SIGSTOP)
    try:
        time.sleep(0.5)  # (a renewal sent just before the stop commits)
        lease_end = db.job(job_id)["locked_until"].timestamp()
        time.sleep(max(0.0, lease_end - time.time()) + 3.0)
        left = marked(marker)
    finally:
        daemon.send(signal.SIGCONT)
    if job_cgroups == "auto":
        assert left == []
        assert attempt_cgroups(delegated) == []
    else:
        assert len(left) == 2
    error = db.wait_status(job_id, "dead")["last_error"]
    assert "lease" in error and "SIGKILL" not in error, error
    wait_for(lambda: not marked(marker), what="the daemon's sweep after it thawed")


def test_a_killed_childs_attempt_cgroup_is_killed_and_removed_by_the_daemon(
    db: Db, daemons: Daemons, delegated: Path
) -> None:
    """kill -9 of the job child takes its watcher with it (PR_SET_PDEATHSIG): the daemon,
    when it reaps the child, kills what is left in the attempt's cgroup and removes it."""
    daemons.start(HANDLERS, WORKER, cgroup=str(delegated))
    marker = f"pgworkerd-test-{uuid.uuid4().hex}"
    job_id = db.enqueue("escape", {"marker": marker, "seconds": 600})
    wait_for(lambda: len(marked(marker)) == 2, what="the escapees")
    [name] = attempt_cgroups(delegated)
    child = cgroup.child_pid_of(name)
    assert child is not None and name.startswith(f"{cgroup.PREFIX}{job_id}-a1-")
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: not attempt_cgroups(delegated), what="the attempt's cgroup removed")
    assert marked(marker) == []
    assert db.wait_status(job_id, "dead")["status"] == "dead"

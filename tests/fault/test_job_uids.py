"""Fault tier: [worker] job_uids, jobs that cannot touch each other (issue 22, audit N10).

The attacker is the 2026-11-26 audit's (security-2026-11-26-repro/job_isolation.sh with
sechandlers.py), ported to tests/support/isolationhandlers.py: while a victim job runs,
another job writes into the victim's captured output through /proc/PID/fd/1, reads its
environment and its TMPDIR, kills its child, signals the daemon and reads the daemon's
config (with the DSN) and /proc files. With job_uids every one of those fails; without
(the default, one uid for the daemon and every job) every one succeeds: that test says
plainly what the default is. The containment escapes of the audit (clone(CLONE_PARENT),
double fork + setsid, a user + PID namespace) leave nothing alive after the attempt
either way.

These tests run as root (as CI and these machines do); the daemons' TMPDIR is a directory
job users may pass through (the tests' tmp_path is root's alone).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import PGWORKERD, DaemonProcess, Daemons, Db, wait_for
from proctree import children_of, process_state, process_title

from pgworkerd.worker.capture import path_for

# A range per pytest-xdist worker: two daemons on one host never share a uid (the second
# would refuse to start).
FIRST = 61000 + 64 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
LAST = FIRST + 7
UIDS = f"{FIRST}-{LAST}"
HANDLERS = {
    name: {"target": f"isolationhandlers:{name}", "max_attempts": 1}
    for name in ("victim", "attack", "escapes", "allocate")
}
WORKER = {"slots": 3, "warm_children": 1, "kill_grace": "2s", "drain_timeout": "1s"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job users need a root daemon")


@pytest.fixture
def open_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The daemons' TMPDIR (and their configs' directory): a directory under /tmp that
    others may pass through (0711), as /tmp itself is for a daemon run by systemd."""
    path = Path(tempfile.mkdtemp(prefix="pgworkerd-jobuids-", dir="/tmp"))
    path.chmod(0o711)
    monkeypatch.setenv("TMPDIR", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def config_in(open_tmp: Path, daemons: Daemons, worker: dict[str, Any]) -> Path:
    """A config holding the DSN (what a job must not read), mode 0600."""
    path = open_tmp / f"pgworkerd-{uuid.uuid4().hex[:6]}.toml"
    daemons.config(HANDLERS, worker, path=path, tables={"database": {"dsn": daemons.dsn}})
    path.chmod(0o600)
    return path


def uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M)[1])  # type: ignore[index]


def uid_if_alive(pid: int) -> int | None:
    try:
        return uid_of(pid)
    except FileNotFoundError:
        return None


def forkserver_of(daemon: DaemonProcess) -> int:
    [pid] = [p for p in children_of(daemon.pid) if "worker.forkserver" in process_title(p)]
    return pid


def child_of(daemon: DaemonProcess, job_id: int) -> int:
    line = daemon.wait_log(rf"job {job_id} \S+ attempt 1: started in child \d+")
    return int(re.search(r"started in child (\d+)", line)[1])  # type: ignore[index]


def attack_a_victim(
    db: Db, daemons: Daemons, config: Path
) -> tuple[DaemonProcess, dict[str, Any], dict[str, Any], str, int]:
    """Run the victim, then the attacker against it and the daemon. Returns the daemon,
    the attacker's result, the victim's row, its stored output and its child's uid."""
    daemon = daemons.start(config)
    victim = db.enqueue("victim", {"seconds": 10})  # (alive while the attacker runs)
    progress = wait_for(lambda: db.job(victim)["progress"], what="the victim's progress")
    victim_uid = uid_of(progress["pid"])
    attacker = db.enqueue(
        "attack",
        {
            "victim": progress["pid"],
            "sleeper": progress["sleeper"],
            "tmpdir": progress["tmpdir"],
            "secret": progress["secret"],
            "daemon": daemon.pid,
            "forkserver": forkserver_of(daemon),
            "config": str(config),
        },
    )
    result = db.wait_status(attacker, "completed")["result"]
    row = db.wait_status(victim, "completed", "dead")
    logs = db.rows("SELECT head || tail AS text FROM {schema}.job_logs WHERE job_id = %s", [victim])
    return daemon, result, row, "".join(r["text"] for r in logs), victim_uid


def test_with_job_uids_no_attack_of_the_audit_reaches_another_job_or_the_daemon(
    db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    config = config_in(open_tmp, daemons, {**WORKER, "job_uids": UIDS})
    daemon, result, victim, output, victim_uid = attack_a_victim(db, daemons, config)

    assert FIRST <= result["uid"] <= LAST and FIRST <= victim_uid <= LAST
    assert result["uid"] != victim_uid
    for attack in (
        "write_victim_fd1",
        "read_victim_environ",
        "list_victim_tmpdir",
        "read_victim_secret",
        "read_daemon_config",
        "read_daemon_environ",
        "daemon_fds",
        "signal_daemon",
        "signal_forkserver",
        "signal_victim",
        "kill_victim_sleeper",
    ):
        assert result[attack] == "PermissionError", (attack, result[attack])
    assert victim["status"] == "completed", victim  # its child lived on
    assert "victim output" in output and "FORGED" not in output
    # The attacker's own descriptors: its channel to the daemon (one socket), its output
    # (the root-owned file, unlinked by the daemon), the daemon's stdout and stderr it
    # puts back between jobs; nothing of the config, no other socket.
    own = result["own_fds"]
    assert sum(1 for _fd, target, _mode in own if target.startswith("socket:")) == 1, own
    assert not [t for _fd, t, _m in own if str(config) in t or t.endswith(".toml")], own
    # The daemon ran on and still runs.
    assert daemon.proc is not None and daemon.proc.poll() is None
    # The victim's TMPDIR is the uid's, in a directory of its child's own.
    scratch = Path(victim["progress"]["tmpdir"])
    assert scratch.parent.name == f"{victim['progress']['pid']}-u{victim_uid}"


def test_without_job_uids_every_attack_of_the_audit_succeeds(
    db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    """Today's default, said plainly: jobs share the daemon's uid (root here), so one job
    can do all of this to another and to the daemon."""
    config = config_in(open_tmp, daemons, WORKER)
    _daemon, result, _victim, output, victim_uid = attack_a_victim(db, daemons, config)

    assert result["uid"] == victim_uid == os.geteuid()
    for attack in (
        "write_victim_fd1",
        "read_victim_environ",
        "list_victim_tmpdir",
        "read_daemon_environ",
        "daemon_fds",
        "signal_victim",
    ):
        assert result[attack].startswith("ok: "), (attack, result[attack])
    assert "the victim's secret" in result["read_victim_secret"]
    assert daemons.dsn in result["read_daemon_config"]  # the DSN, password and all
    assert result["signal_daemon"] == "ok: None"  # SIGKILL would have killed it
    assert result["signal_forkserver"] == "ok: None"
    assert result["kill_victim_sleeper"] == "ok: None"
    assert "FORGED: written by another job" in output


def test_a_daemon_without_the_rights_or_with_a_readable_config_refuses_job_uids(
    daemons: Daemons, open_tmp: Path
) -> None:
    config = config_in(open_tmp, daemons, {**WORKER, "job_uids": UIDS})
    run = [str(PGWORKERD), "--config", str(config), "run"]
    # Root without CAP_SETUID (a bounding set without it, as systemd's
    # CapabilityBoundingSet= does): exit 3, saying what is missing.
    capless = subprocess.run(
        ["setpriv", "--bounding-set=-setuid", "--", *run],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert capless.returncode == 3, capless
    assert "worker.job_uids" in capless.stderr and "CAP_SETUID" in capless.stderr
    # A config other users can read: every job could (the DSN is in it).
    config.chmod(0o644)
    readable = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert readable.returncode == 3, readable
    assert "readable by other users" in readable.stderr and daemons.dsn not in readable.stderr


def marked(marker: str) -> dict[int, str]:
    """pid -> how, of the live processes whose argv holds `marker`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv and process_state(int(entry.name)) not in (None, "Z", "X"):
            found[int(entry.name)] = argv[argv.index(marker.encode()) + 1].decode()
    return found


@pytest.mark.parametrize("uids", [UIDS, None], ids=["job_uids", "default"])
@pytest.mark.parametrize("ending", ["completion", "kill -9 child"])
def test_the_audits_escapes_do_not_outlive_the_attempt(
    uids: str | None, ending: str, db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    worker = {**WORKER, "job_uids": uids} if uids else WORKER
    daemon = daemons.start(config_in(open_tmp, daemons, worker))
    marker = f"pgworkerd-test-{uuid.uuid4().hex}"
    seconds = 6 if ending == "completion" else 300
    job = db.enqueue("escapes", {"marker": marker, "seconds": seconds})
    child = child_of(daemon, job)
    # (the clone(CLONE_PARENT) sleeper is the daemon's child: its sweep may kill it before
    # it is seen, as the audit saw; it must be gone at the end like the others)
    hows = {"double-fork", "userns"}
    escaped = wait_for(
        lambda: hows <= set((m := marked(marker)).values()) and m, what="the escapes running"
    )
    # each escape is the job's uid (the CLONE_PARENT sleeper may be swept away meanwhile)
    seen = {pid: uid_if_alive(pid) for pid in escaped}
    assert all(seen[pid] is not None for pid, how in escaped.items() if how in hows), seen
    owners = {uid for uid in seen.values() if uid is not None}
    assert owners == {uid_of(child)}, owners
    if uids:
        assert FIRST <= uid_of(child) <= LAST

    if ending == "kill -9 child":
        os.kill(child, signal.SIGKILL)
        expected = "dead"
    else:
        expected = "completed"
    wait_for(lambda: not marked(marker), what=f"no process of job {job} left")
    assert db.wait_status(job, expected)["status"] == expected
    # the child's output file and directories went with it
    wait_for(
        lambda: (
            not list(open_tmp.glob(f"pgworkerd-0/d*/{child}-*"))
            and not list(open_tmp.glob(f"pgworkerd-0/d*/{Path(path_for('', child)).name}"))
        ),
        what="the child's leftovers removed",
    )


def test_a_reload_keeps_the_job_uids_the_daemon_started_with(
    db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    """The uids of live children belong to the range the daemon started with: a reload
    that changes job_uids (here: removes it) keeps it, and says so."""
    config = config_in(open_tmp, daemons, {**WORKER, "job_uids": UIDS})
    daemon = daemons.start(config)
    text = config.read_text().replace(f'job_uids = "{UIDS}"\n', "")
    assert "job_uids" not in text
    config.write_text(text)
    daemon.send(signal.SIGHUP)
    daemon.wait_log("job_uids changed .* applies after a restart")
    daemon.wait_log(r"reloaded ")
    job = db.enqueue("victim", {"seconds": 1})
    progress = wait_for(lambda: db.job(job)["progress"], what="the job's progress")
    assert FIRST <= uid_of(progress["pid"]) <= LAST
    assert db.wait_status(job, "completed")["status"] == "completed"


def test_a_job_user_is_still_measured_and_stopped_at_its_memory_limit(
    db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    """The child reads its tree's /proc files as the job user (non-dumpable children
    included) and kills over the limit."""
    worker = {**WORKER, "job_uids": UIDS, "memory_limit": "150MiB"}
    daemons.start(config_in(open_tmp, daemons, worker))
    job = db.enqueue("allocate", {"mib": 400})
    row = db.wait_status(job, "dead")
    assert re.match(r"memory limit 150 MiB exceeded \(peak [\d.]+ MiB\)", row["last_error"]), row


def test_a_reused_child_keeps_its_uid_and_gives_each_job_its_own_tmpdir(
    db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    worker = {**WORKER, "job_uids": UIDS, "slots": 1, "warm_children": 0, "max_jobs_per_child": 3}
    daemons.start(config_in(open_tmp, daemons, worker))
    seen = []
    for _ in range(2):
        job = db.enqueue("victim", {"seconds": 0.5})
        progress = wait_for(lambda j=job: db.job(j)["progress"], what="the job's progress")
        seen.append((progress["pid"], uid_of(progress["pid"]), progress["tmpdir"]))
        assert db.wait_status(job, "completed")["status"] == "completed"
    (pid1, uid1, tmp1), (pid2, uid2, tmp2) = seen
    assert pid1 == pid2 and uid1 == uid2 and FIRST <= uid1 <= LAST and tmp1 != tmp2
    for scratch in (tmp1, tmp2):
        wait_for(lambda s=scratch: not Path(s).exists(), what="the attempt's TMPDIR removed")


def test_two_daemons_on_one_host_never_share_a_uid(
    db: Db, daemons: Daemons, open_tmp: Path
) -> None:
    """A child kills every process of its uid as it starts: a second daemon whose range
    overlaps a running one's would kill that daemon's jobs. It refuses to start instead."""
    daemons.start(config_in(open_tmp, daemons, {**WORKER, "job_uids": UIDS}))
    overlapping = f"{LAST}-{LAST + 8}"
    config = config_in(open_tmp, daemons, {**WORKER, "job_uids": overlapping})
    second = subprocess.run(
        [str(PGWORKERD), "--config", str(config), "run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 3, second
    assert f"some of the uids {overlapping} are another running daemon's" in second.stderr

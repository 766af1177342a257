"""deploy/deploy-host under a real systemd (the testbed and the daemon units of
tests/acceptance/test_systemd.py): drain --wait, install, restart, check; and an aborted deploy
(install fails, drain times out, deploy-host interrupted) resumes the host's daemon and
leaves it running as it was.

deploy-host runs inside the testbed's namespaces, so its `systemctl` talks to the
testbed's systemd; its `pgworkerd drain/resume` reach the unit's schema through
PGWORKERD_DSN/PGWORKERD_SCHEMA/PGWORKERD_CONFIG.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import test_systemd as sd
from test_systemd import DB, PGWORKERD, REPO, Service

from pgworkerd import client

DEPLOY_HOST = REPO / "deploy" / "deploy-host"

# The module-scoped testbed and database, and the unit factory, of test_systemd (a
# testbed of this module's own: pytest scopes these per module).
testbed = sd.testbed
database = sd.database
make_service = sd.make_service


def deploy_env(svc: Service) -> dict[str, str]:
    return {
        "PGWORKERD": str(PGWORKERD),
        # The code of this tree, as for the unit (the venv's editable install may name
        # another checkout).
        "PYTHONPATH": str(REPO),
        "PGWORKERD_DSN": svc.pg.tcp_dsn(DB),
        "PGWORKERD_SCHEMA": svc.schema,
        "PGWORKERD_CONFIG": str(svc.config),
    }


def deploy_argv(svc: Service, install: tuple[str, ...], drain_timeout: str) -> list[str]:
    """deploy-host's command line inside the testbed, its environment set by `env`."""
    return [
        "env",
        *(f"{k}={v}" for k, v in deploy_env(svc).items()),
        str(DEPLOY_HOST),
        "--unit",
        svc.unit,
        "--drain-timeout",
        drain_timeout,
        "--",
        *install,
    ]


def deploy(
    svc: Service, *install: str, drain_timeout: str = "30s"
) -> subprocess.CompletedProcess[str]:
    proc = svc.tb.run(*deploy_argv(svc, install, drain_timeout), timeout=90)
    print(f"--- deploy-host (exit {proc.returncode}) ---\n{proc.stdout}{proc.stderr}")
    return proc


def cli(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    """The pgworkerd command on the host, on the unit's schema."""
    return subprocess.run(
        [str(PGWORKERD), *args],
        env={**os.environ, **deploy_env(svc)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def live_daemons(svc: Service) -> list[dict[str, Any]]:
    proc = cli(svc, "status", "--json")
    return [d for d in json.loads(proc.stdout)["daemons"] if d["state"] != "gone"]


def assert_serving(svc: Service, main_pid: str) -> None:
    """The unit's daemon (main_pid) is up, undrained and claims a new job."""
    assert svc.state() == "active"
    assert svc.prop("MainPID") == main_pid
    # A daemon notices a resume within a second.
    svc.wait(lambda: svc.status().startswith("running: "), "STATUS=running: ...")
    [daemon] = live_daemons(svc)
    assert (daemon["pid"], daemon["drain_requested"]) == (int(main_pid), False), daemon
    job = svc.enqueue("sleep", {"seconds": 0.2, "steps": 1})
    svc.wait(lambda: svc.job_status(job) == "completed", f"the new job {job} completed")
    status = cli(svc, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "DRAINED" not in status.stderr


def test_deploy_drains_installs_and_restarts(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    svc = make_service()
    svc.start()
    old_pid = svc.prop("MainPID")
    job = svc.enqueue("sleep", {"seconds": 4, "steps": 8})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    snapshot, installed = tmp_path / "at-install.json", tmp_path / "installed"
    # The install command records what `status` saw when it ran.
    install = 'set -e; "$PGWORKERD" status --json > "$1" || [ $? -eq 1 ]; touch "$2"'
    proc = deploy(svc, "sh", "-c", install, "sh", str(snapshot), str(installed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"done: {svc.unit} is active" in proc.stderr

    # The job ran through: one attempt, not released, not stopped early.
    row = svc.job(job)
    assert (row["status"], row["attempts"]) == ("completed", 1), row
    assert row["result"] == {"slept": 4.0, "resumed_from": 0}, row
    # The install ran once the drain had finished: the old daemon drained and idle.
    assert installed.exists()
    at_install = json.loads(snapshot.read_text())
    assert at_install["running_jobs"] == []
    assert at_install["counts"] == {client.DEFAULT_QUEUE: {"completed": 1}}
    [old] = [d for d in at_install["daemons"] if d["state"] != "gone"]
    assert (old["pid"], old["state"], old["drain_requested"], old["in_flight"]) == (
        int(old_pid),
        "drained",
        True,
        [],
    ), old
    # Restarted: a new daemon, active, undrained, claiming.
    new_pid = svc.prop("MainPID")
    assert new_pid not in (old_pid, "0")
    assert_serving(svc, new_pid)


def test_failed_install_resumes_the_daemon_without_restarting_it(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    proc = deploy(svc, "false")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "drained: no jobs running" in proc.stdout  # the drain did happen
    assert "deploy aborted" in proc.stderr
    assert "resumed 1 daemon(s)" in proc.stdout
    assert "restarting" not in proc.stderr
    assert svc.prop("NRestarts") == "0"
    assert_serving(svc, main_pid)


def test_drain_timeout_resumes_without_installing_or_restarting(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    job = svc.enqueue("hang", {"seconds": 10})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    installed = tmp_path / "installed"
    started = time.monotonic()
    proc = deploy(svc, "touch", str(installed), drain_timeout="2s")
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"still running: {job}" in proc.stderr
    assert "resumed 1 daemon(s)" in proc.stdout
    assert took < 8, took
    assert not installed.exists()
    assert "restarting" not in proc.stderr
    # The job was left alone: still running its first attempt.
    row = svc.job(job)
    assert (row["status"], row["attempts"]) == ("running", 1), row
    assert_serving(svc, main_pid)
    svc.wait(lambda: svc.job_status(job) == "completed", "the long job completed")
    assert svc.job(job)["attempts"] == 1
    assert svc.prop("MainPID") == main_pid


def test_interrupted_deploy_resumes_the_daemon(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """Ctrl-C (or a CI runner's SIGTERM to the process group) while `drain --wait` waits:
    the drain is undone, nothing is installed, nothing restarted."""
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    job = svc.enqueue("hang", {"seconds": 30})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    installed = tmp_path / "installed"
    assert svc.tb.pid is not None
    proc = subprocess.Popen(
        [
            "nsenter",
            "-t",
            str(svc.tb.pid),
            "-m",
            "-p",
            "-u",
            "--",
            *deploy_argv(svc, ("touch", str(installed)), "30s"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    try:
        svc.wait(lambda: svc.status() == "draining: 1 jobs left", "the daemon draining")
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"--- deploy-host (exit {proc.returncode}) ---\n{out}{err}")
    assert "resumed 1 daemon(s)" in out, out + err
    assert not installed.exists()
    assert "restarting" not in err
    assert svc.job(job)["status"] == "running"
    assert_serving(svc, main_pid)


def test_deploy_leaves_the_other_daemons_of_the_host_alone(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """Two units on one host and schema (e.g. pgworkerd@ instances): deploying one drains
    and restarts only that one."""
    a = make_service()
    b = make_service(schema=False)
    b.schema = a.schema
    b.install()
    a.start()
    b.start()
    a_pid, b_pid = a.prop("MainPID"), b.prop("MainPID")
    snapshot = tmp_path / "at-install.json"
    install = '"$PGWORKERD" status --json > "$1" || [ $? -eq 1 ]'
    proc = deploy(a, "sh", "-c", install, "sh", str(snapshot))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    at_install = {d["pid"]: d for d in json.loads(snapshot.read_text())["daemons"]}
    assert at_install[int(a_pid)]["drain_requested"] is True
    assert at_install[int(b_pid)]["drain_requested"] is False
    assert at_install[int(b_pid)]["state"] == "running"
    assert a.prop("MainPID") != a_pid
    assert b.prop("MainPID") == b_pid
    assert {d["drain_requested"] for d in live_daemons(a)} == {False}
    status = cli(a, "status")
    assert status.returncode == 0, status.stdout + status.stderr


def test_deploy_of_a_stopped_unit_installs_and_starts_it(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    svc = make_service()
    installed = tmp_path / "installed"
    proc = deploy(svc, "touch", str(installed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to drain" in proc.stderr
    assert installed.exists()
    assert_serving(svc, svc.prop("MainPID"))


def test_deploy_of_an_unknown_unit_installs_nothing(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    svc = dataclasses.replace(make_service(), unit="pgw-no-such-unit.service")
    installed = tmp_path / "installed"
    proc = deploy(svc, "touch", str(installed))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no such unit" in proc.stderr
    assert not installed.exists()

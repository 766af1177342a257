"""deploy/deploy-host under a real systemd (the testbed and the daemon units of
tests/acceptance/test_systemd.py).

By default it hands the unit's jobs back (`pgworkerd drain --hand-back --wait`): a busy
host deploys in about the grace, its jobs handed back with their checkpoints (attempt not
counted, nothing of the old process tree left) and resumed by the new version. With
--finish it drains the old way (jobs run to their end). An aborted deploy (install fails,
drain times out, deploy-host interrupted) resumes the host's daemon and leaves it running
as it was; a bad option changes nothing.

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

import pytest
import test_systemd as sd
from test_systemd import DB, HANDLERS, PGWORKERD, REPO, Service

from pgworkerd import client
from pgworkerd.queue import views

DEPLOY_HOST = REPO / "deploy" / "deploy-host"
# The unit's code: this tree, and the test handlers (tests/support/deployhandlers.py).
PYTHONPATH = f'"PYTHONPATH={REPO}:{REPO / "tests" / "support"}"'
DEPLOY_HANDLERS = {
    **HANDLERS,
    "transcode": "deployhandlers:transcode",
    "stubborn": "deployhandlers:stubborn",
}

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


def deploy_argv(svc: Service, *args: str) -> list[str]:
    """deploy-host's command line inside the testbed, its environment set by `env`:
    `args` are its options, `--` and the install command."""
    return [
        "env",
        *(f"{k}={v}" for k, v in deploy_env(svc).items()),
        str(DEPLOY_HOST),
        "--unit",
        svc.unit,
        *args,
    ]


def deploy(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    proc = svc.tb.run(*deploy_argv(svc, *args), timeout=120)
    print(f"--- deploy-host (exit {proc.returncode}) ---\n{proc.stdout}{proc.stderr}")
    return proc


def interrupted_deploy(svc: Service, until: Callable[[], bool], what: str, *args: str) -> str:
    """Ctrl-C (or a CI runner's SIGTERM to the process group) once `until()`: deploy-host's
    output."""
    assert svc.tb.pid is not None
    proc = subprocess.Popen(
        ["nsenter", "-t", str(svc.tb.pid), "-m", "-p", "-u", "--", *deploy_argv(svc, *args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )
    try:
        svc.wait(until, what)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"--- deploy-host (exit {proc.returncode}) ---\n{out}{err}")
    return out + err


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


def busy_service(make_service: Callable[..., Service]) -> Service:
    svc = make_service(Environment=PYTHONPATH)
    svc.write_config(DEPLOY_HANDLERS)
    return svc


def outcomes(svc: Service, job_id: int) -> list[str]:
    """The outcomes of the job's attempts, oldest first."""
    with svc.connect() as conn:
        row = views.job(conn, svc.schema, job_id)
    assert row is not None and row["attempt_history"] is not None
    return [a["outcome"] for a in sorted(row["attempt_history"], key=lambda a: a["finished_at"])]


def processes(svc: Service) -> list[str]:
    return svc.tb.run("ps", "-eo", "args", "--no-headers").stdout.splitlines()


def test_deploy_of_a_busy_host_hands_its_jobs_back_and_the_new_version_resumes_them(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """The default deploy of a host running two long jobs: one checkpoints and stops when
    asked, one ignores the request and runs a subprocess. Both are handed back within the
    grace, long before they would end; the install sees no job process left; the new
    version resumes the first from its checkpoint, with one attempt counted in all."""
    svc = busy_service(make_service)
    svc.start()
    old_pid = svc.prop("MainPID")
    marker = 7000 + int(time.time()) % 1000  # `sleep 7xyz`: the stubborn job's subprocess
    long = svc.enqueue("transcode", {"steps": 100, "step_seconds": 0.5})  # 50 s
    stubborn = svc.enqueue("stubborn", {"marker": marker})
    svc.wait(lambda: (svc.job(long)["checkpoint"] or {}).get("step", 0) >= 4, "checkpoints saved")
    svc.wait(lambda: f"sleep {marker}" in processes(svc), "the stubborn job's subprocess")
    svc.wait(lambda: svc.settled(stubborn), "a warm child ready")
    # The install command records what the host looked like when it ran.
    install = (
        'set -e; for id in "$2" "$3"; do "$PGWORKERD" show "$id" --json > "$1/$id.json"; done;'
        ' ps -eo args --no-headers > "$1/ps.txt";'
        ' "$PGWORKERD" status --json > "$1/status.json" || [ $? -eq 1 ]'
    )
    proc = deploy(
        svc, "--grace", "3s", "--", "sh", "-c", install, "sh", str(tmp_path), str(long),
        str(stubborn),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "handing back the jobs of" in proc.stderr and "grace 3s" in proc.stderr
    assert "handed back: no targeted jobs running" in proc.stdout
    assert f"done: {svc.unit} is active" in proc.stderr

    # At install time: both jobs handed back (pending, attempt not counted, the
    # checkpoint kept), with the released attempt in their history.
    at_install = {j: json.loads((tmp_path / f"{j}.json").read_text()) for j in (long, stubborn)}
    for row in at_install.values():
        assert (row["status"], row["attempts"], row["locked_by"]) == ("pending", 0, None), row
        assert [a["outcome"] for a in row["attempt_history"]] == ["released"], row
    saved = at_install[long]["checkpoint"]["step"]
    assert 4 <= saved < 100, at_install[long]
    # Nothing of the old tree runs jobs: no job process, not the stubborn one's subprocess.
    ps = (tmp_path / "ps.txt").read_text()
    assert "pgworkerd: job" not in ps and f"sleep {marker}" not in ps, ps
    [old] = [d for d in json.loads((tmp_path / "status.json").read_text())["daemons"]
             if d["state"] != "gone"]  # fmt: skip
    assert (old["pid"], old["in_flight"], old["drain_requested"]) == (int(old_pid), [], True)

    # The new version: READY (systemctl restart returned), resumes the checkpointing job
    # from its checkpoint and runs it to its end: one attempt counted.
    new_pid = svc.prop("MainPID")
    assert new_pid not in (old_pid, "0") and svc.state() == "active"
    svc.wait(lambda: svc.job_status(long) == "running", "the long job resumed")
    resumed_at = svc.job(long)["checkpoint"]["step"]
    assert resumed_at >= saved
    svc.wait(lambda: svc.job_status(long) == "completed", "the long job completed", 120)
    row = svc.job(long)
    assert row["attempts"] == 1, row
    assert row["result"]["resumed_from"] >= saved, row
    # The stubborn job runs again on the new daemon: its first attempt was not counted.
    svc.wait(lambda: svc.job_status(stubborn) == "running", "the stubborn job claimed again")
    assert svc.job(stubborn)["attempts"] == 1


def test_deploy_hands_jobs_to_another_daemon_that_resumes_them_before_the_restart(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """A fleet: a second daemon (another unit on the same schema) is up. The jobs the
    deployed host hands back run there at once, from their checkpoints, while the install
    runs; the deployed unit restarts without them."""
    a = busy_service(make_service)
    a.start()
    long = a.enqueue("transcode", {"steps": 100, "step_seconds": 0.5})  # 50 s
    a.wait(lambda: (a.job(long)["checkpoint"] or {}).get("step", 0) >= 4, "checkpoints saved")
    b = make_service(schema=False, Environment=PYTHONPATH)
    b.schema = a.schema
    b.write_config(DEPLOY_HANDLERS)
    b.install(Environment=PYTHONPATH)
    b.start()
    [b_daemon] = [d for d in live_daemons(a) if d["pid"] == int(b.prop("MainPID"))]
    # The install waits until the job runs elsewhere, and records it.
    install = (
        'for i in $(seq 300); do "$PGWORKERD" show "$2" --json > "$1"; '
        'grep -q \'"status": "running"\' "$1" && exit 0; sleep 0.1; done; exit 1'
    )
    snapshot = tmp_path / "at-install.json"
    proc = deploy(a, "--grace", "20s", "--", "sh", "-c", install, "sh", str(snapshot), str(long))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    at_install = json.loads(snapshot.read_text())
    # Handed back at the handler's next step (well inside the grace), taken by b.
    assert at_install["locked_by"] == b_daemon["id"], at_install
    assert at_install["attempts"] == 1, at_install
    saved = at_install["checkpoint"]["step"]
    b.wait(lambda: b.job_status(long) == "completed", "the job completed on b", 120)
    row = b.job(long)
    # b resumed from the checkpoint a saved (b has saved more since the install looked).
    assert row["attempts"] == 1 and 4 <= row["result"]["resumed_from"] <= saved, row
    assert outcomes(b, long) == ["released", "completed"]
    assert a.state() == "active"


def test_deploy_with_finish_lets_jobs_finish_installs_and_restarts(
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
    proc = deploy(svc, "--finish", "--", "sh", "-c", install, "sh", str(snapshot), str(installed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "waiting up to 10m for running jobs to finish" in proc.stderr
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


@pytest.mark.parametrize("mode", [(), ("--finish",)], ids=["hand-back", "finish"])
def test_failed_install_resumes_the_daemon_without_restarting_it(
    make_service: Callable[..., Service], mode: tuple[str, ...]
) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    proc = deploy(svc, *mode, "--", "false")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    # the drain did happen
    done = "drained: no jobs running" if mode else "handed back: no targeted jobs running"
    assert done in proc.stdout
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
    # A job far longer than the deploy: a deploy that waited for it instead of giving up
    # at --drain-timeout would take 30 s, while the drain's 2 s and deploy-host's two
    # pgworkerd commands took 8.6 s on a loaded 2-core box (the old bound was 8 s).
    job = svc.enqueue("hang", {"seconds": 30})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    installed = tmp_path / "installed"
    started = time.monotonic()
    proc = deploy(svc, "--finish", "--drain-timeout", "2s", "--", "touch", str(installed))
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"still running: {job}" in proc.stderr
    assert "resumed 1 daemon(s)" in proc.stdout
    assert took < 20, took
    assert not installed.exists()
    assert "restarting" not in proc.stderr
    # The job was left alone: still running its first attempt.
    row = svc.job(job)
    assert (row["status"], row["attempts"]) == ("running", 1), row
    assert_serving(svc, main_pid)
    svc.wait(lambda: svc.job_status(job) == "completed", "the long job completed", 60)
    assert svc.job(job)["attempts"] == 1
    assert svc.prop("MainPID") == main_pid


def test_hand_back_timeout_resumes_and_the_job_runs_on(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """The grace comes from the config (worker.stop_grace, 30s by default) and is longer
    than --drain-timeout: the deploy gives up, nothing is installed, and the job, still
    inside its grace, runs on (the resume lifts the hand-back)."""
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    job = svc.enqueue("hang", {"seconds": 12})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    installed = tmp_path / "installed"
    proc = deploy(svc, "--drain-timeout", "3s", "--", "touch", str(installed))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "grace each handler's stop_grace" in proc.stderr
    assert f"still running: {job}" in proc.stderr
    assert "resumed 1 daemon(s)" in proc.stdout
    assert not installed.exists()
    assert "restarting" not in proc.stderr
    assert_serving(svc, main_pid)
    svc.wait(lambda: svc.job_status(job) == "completed", "the job completed", 60)
    row = svc.job(job)
    assert row["attempts"] == 1, row
    assert outcomes(svc, job) == ["completed"], row


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
    output = interrupted_deploy(
        svc,
        lambda: svc.status() == "draining: 1 jobs left",
        "the daemon draining",
        "--finish",
        "--",
        "touch",
        str(installed),
    )
    assert "resumed 1 daemon(s)" in output, output
    assert not installed.exists()
    assert "restarting" not in output
    assert svc.job(job)["status"] == "running"
    assert_serving(svc, main_pid)


def test_interrupted_hand_back_resumes_the_daemon_and_its_jobs_run_on(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """Interrupted inside the grace: the daemon claims again and the job it had been asked
    to stop (one that ignores the request) is not handed back when the grace ends."""
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    job = svc.enqueue("hang", {"seconds": 12})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    installed = tmp_path / "installed"
    output = interrupted_deploy(
        svc,
        lambda: "handing back 1 job(s)" in svc.tb.journal(svc.unit),
        "the daemon handing its job back",
        "--grace",
        "4s",
        "--",
        "touch",
        str(installed),
    )
    assert "resumed 1 daemon(s)" in output, output
    assert not installed.exists()
    assert "restarting" not in output
    assert_serving(svc, main_pid)
    svc.wait(lambda: svc.job_status(job) == "completed", "the job completed", 60)
    assert outcomes(svc, job) == ["completed"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--grace", "30x"), "--grace '30x' is not a duration"),
        (("--grace", "-5s"), "--grace '-5s' is not a duration"),
        (("--grace", "87600h"), "--grace '87600h' is longer than 1 day"),
        (("--finish", "--grace", "3s"), "--grace is for the hand-back drain"),
        (("--grace", "1m", "--drain-timeout", "30s"), "must be longer than --grace"),
        (("--drain-timeout", "0"), "--drain-timeout must be above 0"),
        (("--grace",), "--grace needs a value"),
        (("--hand-back",), "unknown option --hand-back"),
    ],
)
def test_a_bad_option_changes_nothing(
    make_service: Callable[..., Service],
    tmp_path: Path,
    options: tuple[str, ...],
    message: str,
) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    installed = tmp_path / "installed"
    tail = () if options == ("--grace",) else ("--", "touch", str(installed))
    proc = deploy(svc, *options, *tail)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "usage: deploy/deploy-host" in proc.stderr
    assert not installed.exists()
    [daemon] = live_daemons(svc)
    assert (daemon["pid"], daemon["drain_requested"]) == (int(main_pid), False), daemon
    assert svc.prop("MainPID") == main_pid


def test_stop_timeout_is_extended_by_the_daemon_past_timeout_stop_sec(
    make_service: Callable[..., Service],
) -> None:
    """What README "Deploying a host" says of `systemctl stop/restart` without deploy-host:
    on SIGTERM the daemon sends EXTEND_TIMEOUT_USEC for drain_timeout + kill_grace + 30s,
    so a TimeoutStopSec= shorter than that does not SIGKILL its jobs mid-drain. Here
    TimeoutStopSec=2s, drain_timeout 3s + kill_grace 2s: the stop outlasts TimeoutStopSec,
    ends cleanly and the job is handed back."""
    svc = make_service(TimeoutStopSec="2s")
    svc.start()
    job = svc.enqueue("hang", {"seconds": 120})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    started = time.monotonic()
    svc.systemctl("stop")
    took = time.monotonic() - started
    assert took > 2.5, took  # past TimeoutStopSec: the extension held
    assert svc.prop("Result") == "success"  # not "timeout": nothing was SIGKILLed
    row = svc.job(job)
    assert (row["status"], row["attempts"], row["locked_by"]) == ("pending", 0, None), row


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
    proc = deploy(a, "--", "sh", "-c", install, "sh", str(snapshot))
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
    proc = deploy(svc, "--", "touch", str(installed))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to drain" in proc.stderr
    assert installed.exists()
    assert_serving(svc, svc.prop("MainPID"))


def test_deploy_of_an_unknown_unit_installs_nothing(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    svc = dataclasses.replace(make_service(), unit="pgw-no-such-unit.service")
    installed = tmp_path / "installed"
    proc = deploy(svc, "--", "touch", str(installed))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no such unit" in proc.stderr
    assert not installed.exists()

"""The drop-ins shipped for the daemon's units (systemd/dropin-*.conf) and the dashboard's
unit (systemd/pgworkerd-web.service).

Handlers inherit the daemon unit's sandbox. Each drop-in lifts one part of it, and these
tests show, under a real systemd (the testbed and daemon units of test_systemd.py), that
the job fails the way the drop-in's comment says without it and works with it:
- dropin-output-dirs.conf: a job writing into a directory gets EROFS, then writes;
- dropin-jit.conf: a writable and executable page (what a JIT maps) gets EPERM, then works;
- dropin-job-cgroups.conf: job_cgroups = "require" refuses to start, then each attempt
  runs in a cgroup of its own that is killed whole before the outcome;
- dropin-gpu.conf: the host's device nodes appear but stay closed except the NVIDIA group
  (no GPU here: the same drop-in with the `misc` group in place of `nvidia*` opens
  /dev/net/tun, which it refuses as shipped and which is missing without the drop-in).
Static: every shipped unit verifies and scores at most 1.3 in `systemd-analyze security`,
each drop-in verifies on top of the unit and keeps the score it states.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import test_systemd as sd
from proctree import marked
from psycopg import sql
from sdtestbed import Testbed, derive_unit
from test_systemd import (
    ANALYZE,
    DB,
    HANDLERS,
    INSTALLED_BINARY,
    PGWORKERD,
    REPO,
    UNIT,
    Service,
    needs_analyze,
    one,
    service_settings,
)

import pgworkerd
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

SYSTEMD = REPO / "systemd"
WEB_UNIT = SYSTEMD / "pgworkerd-web.service"
TEMPLATE = SYSTEMD / "pgworkerd@.service"
VENV_PLACEHOLDER = "/opt/pgworkerd/venv/bin/pgworkerd"
# The exposure each drop-in leaves (its comment says so); the shipped units: 1.3.
DROPIN_EXPOSURE = {
    "dropin-output-dirs.conf": 1.3,
    "dropin-jit.conf": 1.3,
    "dropin-gpu.conf": 1.5,
    "dropin-venv.conf": 1.3,
    "dropin-job-uids.conf": 2.9,
    "dropin-job-cgroups.conf": 1.3,
}
SANDBOX_HANDLERS = {
    **HANDLERS,
    "write_output": "sandboxhandlers:write_output",
    "jit_page": "sandboxhandlers:jit_page",
    "open_device": "sandboxhandlers:open_device",
    "probe_daemon": "isolationhandlers:probe_daemon",
    "escape": "cgrouphandlers:escape",
}
# The unit's code: this tree, and the test handlers.
PYTHONPATH = f'"PYTHONPATH={REPO}:{REPO / "tests" / "support"}"'

testbed = sd.testbed
database = sd.database
make_service = sd.make_service


# -- static ---------------------------------------------------------------------------------


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=60, check=False)


def unit_copy(unit: Path, directory: Path, dropin: str | None = None) -> Path:
    """The unit (and a drop-in in its .d/) under `directory`, with binaries that exist
    (`verify` insists on them); a template is returned as an instance path."""
    text = unit.read_text().replace(INSTALLED_BINARY, str(PGWORKERD))
    (directory / unit.name).write_text(text)
    if dropin is not None:
        d = directory / f"{unit.name}.d"
        d.mkdir()
        (d / dropin).write_text(
            (SYSTEMD / dropin).read_text().replace(VENV_PLACEHOLDER, str(PGWORKERD))
        )
    return directory / unit.name.replace("@.", "@example.")


def exposure(path: Path, threshold: float = 2.0) -> tuple[float, str]:
    # --threshold is on the 0-100 scale of the exposure level shown as 0.0-10.0.
    limit = f"--threshold={round(threshold * 10)}"
    proc = analyze("security", "--offline=true", limit, "--no-pager", str(path))
    output = proc.stdout + proc.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", output)
    assert m and proc.returncode == 0, output
    return float(m[1]), output


@needs_analyze
@pytest.mark.parametrize("unit", [UNIT, TEMPLATE, WEB_UNIT], ids=lambda p: p.name)
def test_shipped_units_verify_and_score_at_most_1_3(unit: Path, tmp_path: Path) -> None:
    path = unit_copy(unit, tmp_path)
    proc = analyze("verify", "--man=no", str(path))
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not output, output
    score, output = exposure(path)
    assert score <= 1.3, output


@needs_analyze
@pytest.mark.parametrize("dropin", sorted(DROPIN_EXPOSURE))
@pytest.mark.parametrize("unit", [UNIT, TEMPLATE], ids=lambda p: p.name)
def test_each_dropin_verifies_on_the_unit_and_keeps_its_score(
    unit: Path, dropin: str, tmp_path: Path
) -> None:
    path = unit_copy(unit, tmp_path, dropin)
    proc = analyze("verify", "--man=no", str(path))
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not output, output
    score, output = exposure(path, max(2.0, DROPIN_EXPOSURE[dropin]))
    assert score <= DROPIN_EXPOSURE[dropin], output
    if dropin == "dropin-gpu.conf":  # applied, not silently ignored
        assert "char-nvidia*:rw" in output, output
    if dropin == "dropin-jit.conf":
        assert "✗ MemoryDenyWriteExecute=" in output, output


def test_each_dropin_says_which_failure_it_fixes() -> None:
    for name in DROPIN_EXPOSURE:
        text = (SYSTEMD / name).read_text()
        assert "\n# Fixes: " in text, name
        assert f"pgworkerd files --to /etc/systemd/system/pgworkerd.service.d {name}" in text
        assert "\n[Service]\n" in text, name
    assert "Read-only file system" in (SYSTEMD / "dropin-output-dirs.conf").read_text()
    assert "Operation not permitted" in (SYSTEMD / "dropin-jit.conf").read_text()
    unit = UNIT.read_text()
    for name in DROPIN_EXPOSURE:  # the unit points at them
        assert name in unit, name


def test_venv_dropin_replaces_every_binary_of_the_unit() -> None:
    """ExecReload= runs the binary too (check-config): a drop-in replacing ExecStart= alone
    would fail every reload of a virtualenv install."""
    unit = service_settings(UNIT.read_text())
    dropin = service_settings((SYSTEMD / "dropin-venv.conf").read_text())
    assert set(dropin) == {"ExecStart", "ExecReload"}
    for key in dropin:
        assert dropin[key] == [v.replace(INSTALLED_BINARY, VENV_PLACEHOLDER) for v in unit[key]]


def test_web_unit_is_hardened_like_the_daemon() -> None:
    daemon = service_settings(UNIT.read_text())
    web = service_settings(WEB_UNIT.read_text())
    assert one(web, "Type") == "notify" and one(web, "NotifyAccess") == "main"
    assert one(web, "ExecStart") == f"{INSTALLED_BINARY} --config /etc/pgworkerd/web.toml web"
    assert set(one(web, "RestartPreventExitStatus").split()) == {"2", "3"}
    first_hardening = list(daemon).index("NoNewPrivileges")
    hardening = {k: v for k, v in list(daemon.items())[first_hardening:]}
    assert {k: web.get(k) for k in hardening} == hardening


# -- under a real systemd ---------------------------------------------------------------------


def install_dropin(svc: Service, name: str, text: str) -> None:
    assert svc.tb.pid is not None
    directory = Path(f"/proc/{svc.tb.pid}/root/run/systemd/system/{svc.unit}.d")
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text)
    svc.tb.systemctl("daemon-reload")


def shipped_dropin(name: str, *replace: tuple[str, str]) -> str:
    text = (SYSTEMD / name).read_text()
    for old, new in replace:
        assert old in text, (name, old)
        text = text.replace(old, new)
    return text


def sandbox_service(make_service: Callable[..., Service]) -> Service:
    svc = make_service(Environment=PYTHONPATH)
    svc.write_config(SANDBOX_HANDLERS)
    return svc


def outcome(svc: Service, handler: str, payload: dict[str, object]) -> dict[str, object]:
    """Run one job (one attempt) under the unit: its final row."""
    with svc.connect() as conn:
        job = pgworkerd.enqueue(conn, handler, payload, max_attempts=1, schema=svc.schema)
    svc.wait(lambda: svc.job_status(job) in ("completed", "dead"), f"job {job} to end")
    return svc.job(job)


def test_output_dir_dropin_lets_jobs_write_there(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    out = tmp_path / "media"
    out.mkdir()
    svc = sandbox_service(make_service)
    svc.start()
    row = outcome(svc, "write_output", {"dir": str(out)})
    assert row["status"] == "dead", row
    assert "[Errno 30] Read-only file system" in str(row["last_error"]), row
    assert list(out.iterdir()) == []

    install_dropin(
        svc,
        "dropin-output-dirs.conf",
        shipped_dropin("dropin-output-dirs.conf", ("=/srv/pgworkerd", f"={out}")),
    )
    svc.systemctl("restart")
    row = outcome(svc, "write_output", {"dir": str(out)})
    assert row["status"] == "completed", row
    written = out / f"job-{row['id']}.out"
    assert row["result"] == {"wrote": str(written)}
    assert written.read_text() == "rendered\n"
    # Only that directory: the rest of the file system stays read-only.
    row = outcome(svc, "write_output", {"dir": str(tmp_path)})
    assert "[Errno 30] Read-only file system" in str(row["last_error"]), row


def test_jit_dropin_allows_writable_executable_memory(
    make_service: Callable[..., Service],
) -> None:
    svc = sandbox_service(make_service)
    svc.start()
    row = outcome(svc, "jit_page", {})
    assert row["status"] == "dead", row
    assert "[Errno 1] Operation not permitted" in str(row["last_error"]), row

    install_dropin(svc, "dropin-jit.conf", shipped_dropin("dropin-jit.conf"))
    svc.systemctl("restart")
    row = outcome(svc, "jit_page", {})
    assert (row["status"], row["result"]) == ("completed", {"jit": "ok"}), row


def test_gpu_dropin_opens_the_allowed_device_group_only(
    make_service: Callable[..., Service],
) -> None:
    """/dev/net/tun (group `misc`, mode 0666 on the host) stands for /dev/nvidia0: no GPU
    here, so the allowed group is swapped for `misc` in the last step."""
    device = {"path": "/dev/net/tun"}
    if not Path(device["path"]).exists():
        pytest.skip("this host has no /dev/net/tun to stand for a GPU device")
    svc = sandbox_service(make_service)
    svc.start()
    # The unit's private /dev has no such node (nor /dev/nvidia*).
    row = outcome(svc, "open_device", device)
    assert "[Errno 2] No such file or directory" in str(row["last_error"]), row

    install_dropin(svc, "dropin-gpu.conf", shipped_dropin("dropin-gpu.conf"))
    svc.systemctl("restart")
    # The host's /dev, but closed: only the NVIDIA group (and the pseudo devices).
    row = outcome(svc, "open_device", device)
    assert "[Errno 1] Operation not permitted" in str(row["last_error"]), row
    assert outcome(svc, "open_device", {"path": "/dev/null"})["status"] == "completed"

    install_dropin(
        svc,
        "dropin-gpu.conf",
        shipped_dropin(
            "dropin-gpu.conf", ("DeviceAllow=char-nvidia* rw", "DeviceAllow=char-misc rw")
        ),
    )
    svc.systemctl("restart")
    row = outcome(svc, "open_device", device)
    assert (row["status"], row["result"]) == ("completed", {"opened": "/dev/net/tun"}), row


# -- the dashboard's unit ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def web_unit(
    testbed: Testbed, database: LocalPostgres, tmp_path: Path
) -> Iterator[Callable[..., str]]:
    schema = f"t_{uuid.uuid4().hex[:8]}"
    migrate(database.dsn(DB), schema=schema)
    config = tmp_path / "web.toml"
    config.write_text("[web]\npool_size = 2\nallow_anonymous = true\n")
    units: list[str] = []

    def install(*web_args: str) -> str:
        unit = f"pgw-web-{uuid.uuid4().hex[:8]}.service"
        dsn = f"postgresql://postgres@127.0.0.1:{database.port}/{DB}?passfile={database.passfile}"
        text = derive_unit(
            WEB_UNIT.read_text(),
            drop=("Group",),
            ExecStart=f'"{PGWORKERD}" --dsn {dsn} --schema {schema} --config "{config}" web '
            + " ".join(web_args),
            Environment=f'"PYTHONPATH={REPO}"',
            User="root",  # the testbed has no pgworkerd user
            RestartSec="1s",
        )
        testbed.install_unit(unit, text)
        units.append(unit)
        return unit

    yield install
    for unit in units:
        print(testbed.journal(unit))
        testbed.systemctl("stop", unit, check=False)
        testbed.systemctl("reset-failed", unit, check=False)
        testbed.remove_unit(unit)
    with psycopg.connect(database.dsn(DB), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_web_unit_starts_once_bound_serves_and_stops(
    testbed: Testbed, web_unit: Callable[..., str]
) -> None:
    port = free_port()
    unit = web_unit("--port", str(port))
    proc = testbed.systemctl("start", unit, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr + testbed.journal(unit)
    # Type=notify: active only once the port is bound, so the first request is served.
    assert testbed.show(unit, "ActiveState") == "active"
    assert testbed.show(unit, "StatusText") == f"serving http://127.0.0.1:{port}/"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
        body = page.read().decode()
        assert page.status == 200
    assert "pgworkerd" in body and "Queues" in body, body[:2000]
    testbed.systemctl("stop", unit)
    assert testbed.show(unit, "ActiveState") == "inactive"
    assert testbed.show(unit, "Result") == "success"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)


def test_web_unit_refusing_its_bind_fails_the_start_without_restarts(
    testbed: Testbed, web_unit: Callable[..., str]
) -> None:
    # Any address but loopback needs [web.users]: exit 3, which a restart cannot fix.
    unit = web_unit("--bind", "0.0.0.0", "--port", str(free_port()))
    proc = testbed.systemctl("start", unit, check=False)
    assert proc.returncode != 0
    assert testbed.show(unit, "ActiveState") == "failed"
    assert testbed.show(unit, "ExecMainStatus") == "3"
    assert "refusing to listen on '0.0.0.0' without a login" in testbed.journal(unit)
    assert testbed.show(unit, "NRestarts") == "0"


def test_job_uids_dropin_runs_each_job_as_a_user_of_its_own(
    make_service: Callable[..., Service],
) -> None:
    """As shipped, the unit refuses job_uids (exit 3, saying why); with the drop-in a job
    runs as a uid of the range and cannot signal the daemon nor read its config or /proc
    environment (tests/fault/test_job_uids.py has the whole attacker)."""
    svc = make_service(Environment=PYTHONPATH)
    svc.write_config(SANDBOX_HANDLERS)
    # (not the uids of tests/fault/test_job_uids.py: one kernel, but another /run/lock)
    first = 62000 + 64 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    svc.config.write_text(
        svc.config.read_text().replace(
            "[worker]\n", f'[worker]\njob_uids = "{first}-{first + 15}"\n', 1
        )
    )
    svc.config.chmod(0o600)
    svc.systemctl("start", check=False)
    svc.wait(lambda: svc.state() == "failed", "the unit to fail")
    assert "worker.job_uids: the daemon lacks CAP_" in svc.tb.journal(svc.unit)

    svc.systemctl("reset-failed", check=False)
    assert svc.tb.pid is not None  # (the testbed's /run has no /run/lock of its own)
    Path(f"/proc/{svc.tb.pid}/root/run/lock").mkdir(mode=0o1777, exist_ok=True)
    install_dropin(svc, "dropin-job-uids.conf", shipped_dropin("dropin-job-uids.conf"))
    svc.start()
    row = outcome(svc, "probe_daemon", {"config": str(svc.config)})
    assert row["status"] == "completed", row
    result = row["result"]
    assert isinstance(result, dict) and first <= result["uid"] <= first + 15, result
    for attack in ("signal_daemon", "read_daemon_environ", "read_daemon_config"):
        assert result[attack] == "PermissionError", (attack, result)


def test_job_cgroups_dropin_puts_each_attempt_in_a_cgroup_killed_whole(
    make_service: Callable[..., Service],
) -> None:
    """As shipped, the unit's cgroup is not the daemon's: job_cgroups = "require" refuses
    to start (exit 3, saying why). With the drop-in (Delegate=yes) each attempt runs in a
    cgroup of its own under the unit's, and a process that left the job's tree
    (clone(CLONE_PARENT), setsid) is dead when the outcome is stored, the cgroup gone."""
    svc = make_service(Environment=PYTHONPATH)
    svc.write_config(SANDBOX_HANDLERS)
    svc.config.write_text(
        svc.config.read_text().replace(
            "[worker]\n",
            '[worker]\njob_cgroups = "require"\nmax_jobs_per_child = 5\n',
            1,
        )
    )
    svc.systemctl("start", check=False)
    svc.wait(lambda: svc.state() == "failed", "the unit to fail")
    assert 'worker.job_cgroups = "require": ' in svc.tb.journal(svc.unit)
    assert "is not delegated to the daemon" in svc.tb.journal(svc.unit)

    # Delegate=yes alone is not enough with systemd 252: ProtectControlGroups=yes keeps
    # the whole cgroup file system read-only, the delegated part too.
    svc.systemctl("reset-failed", check=False)
    delegate_only = "[Service]\nDelegate=yes\n"
    install_dropin(svc, "dropin-job-cgroups.conf", delegate_only)
    svc.systemctl("start", check=False)
    svc.wait(lambda: svc.state() == "failed", "the unit to fail")
    assert "is not writable here (ProtectControlGroups=?)" in svc.tb.journal(svc.unit)

    svc.systemctl("reset-failed", check=False)
    install_dropin(svc, "dropin-job-cgroups.conf", shipped_dropin("dropin-job-cgroups.conf"))
    svc.start()
    assert "per-attempt cgroups under /sys/fs/cgroup/" in svc.tb.journal(svc.unit)
    assert svc.tb.pid is not None
    unit_cgroup = Path(f"/proc/{svc.tb.pid}/root/sys/fs/cgroup/system.slice/{svc.unit}")
    # the daemon, its fork server, an idle child and its watcher: all in the leaf
    leaf = unit_cgroup / "daemon" / "cgroup.procs"
    svc.wait(lambda: len(leaf.read_text().split()) >= 4, "the warm child in the leaf")
    assert (unit_cgroup / "cgroup.procs").read_text() == ""

    marker = f"pgworkerd-test-{uuid.uuid4().hex}"
    with svc.connect() as conn:
        job = pgworkerd.enqueue(
            conn, "escape", {"marker": marker, "seconds": 3}, max_attempts=1, schema=svc.schema
        )
    escapees = svc.wait(lambda: len(m := marked(marker)) == 2 and m, "the escapees to start")
    for pid in escapees:
        where = Path(f"/proc/{pid}/cgroup").read_text()
        assert f"/{svc.unit}/job-{job}-a1-p" in where, where
    svc.wait(lambda: svc.job_status(job) in ("completed", "dead"), f"job {job} to end")
    assert svc.job_status(job) == "completed", svc.job(job)
    assert marked(marker) == []  # dead before the outcome was stored
    assert sorted(p.name for p in unit_cgroup.iterdir() if p.name.startswith("job-")) == []

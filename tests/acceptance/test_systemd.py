"""The systemd units in systemd/ and the daemon's systemd integration.

Static checks (no systemd needed beyond `systemd-analyze`): both units verify cleanly, the
hardening scores at most 2.0, and the settings the daemon relies on are there.

Under a real systemd (tests/support/sdtestbed.py boots one, hermetic, per module): a unit derived
from systemd/pgworkerd.service runs the real daemon against a private PostgreSQL reached
over TCP (and LISTEN over its unix socket). `systemctl start` returns once the database
answers, STATUS= follows the daemon, stop drains, reload applies a new config, the
watchdog restarts a hung daemon, and configuration errors do not crash-loop.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from sdtestbed import Testbed, derive_unit, unavailable_reason

import pgworkerd
from pgworkerd.config import WorkerConfig
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.exitcodes import RESTART_PREVENTING
from pgworkerd.queue.migrate import migrate

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "pgworkerd.service"
TEMPLATE = REPO / "systemd" / "pgworkerd@.service"
INSTALLED_BINARY = "/usr/local/bin/pgworkerd"  # what the shipped units assume
PGWORKERD = Path(sys.executable).with_name("pgworkerd")
ANALYZE = shutil.which("systemd-analyze")
DB = "pgworkerd_systemd"
DEADLINE = 30.0
WATCHDOG_SEC = 3.0

needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (Debian's `systemd` package)"
)


# -- unit files: parsing ------------------------------------------------------------------


def service_settings(text: str) -> dict[str, list[str]]:
    """[Service] assignments in order, an empty assignment resetting the list."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section != "Service":
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        settings[key] = [] if not value else [*settings.get(key, []), value]
    return settings


def one(settings: dict[str, list[str]], key: str) -> str:
    values = settings.get(key, [])
    assert len(values) == 1, f"{key}: expected exactly one value, got {values}"
    return values[0]


def timespan(text: str) -> float:
    """A systemd time span like "6min", "30s", "1h 30min" in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
    assert parts and "".join(n + u for n, u in parts) == text.replace(" ", ""), text
    return sum(float(n) * units[u] for n, u in parts)


def verifiable_copy(unit: Path, directory: Path) -> Path:
    """The unit under `directory` with ExecStart's binary replaced by one that exists
    (`verify` insists on it); a template is returned as an instance path."""
    text = unit.read_text().replace(INSTALLED_BINARY, str(PGWORKERD))
    copy = directory / unit.name
    copy.write_text(text)
    return directory / unit.name.replace("@.", "@example.") if "@." in unit.name else copy


# -- static checks ------------------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("unit", [UNIT, TEMPLATE], ids=lambda p: p.name)
def test_unit_verifies_cleanly(unit: Path, tmp_path: Path) -> None:
    assert ANALYZE is not None
    path = verifiable_copy(unit, tmp_path)
    proc = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not output, output


@needs_analyze
@pytest.mark.parametrize("unit", [UNIT, TEMPLATE], ids=lambda p: p.name)
def test_unit_hardening_scores_at_most_2(unit: Path, tmp_path: Path) -> None:
    assert ANALYZE is not None
    path = verifiable_copy(unit, tmp_path)
    proc = subprocess.run(
        # --threshold is on the 0-100 scale of the exposure level shown as 0.0-10.0.
        [ANALYZE, "security", "--offline=true", "--threshold=20", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = proc.stdout + proc.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", output)
    assert m, output
    assert float(m[1]) <= 2.0, output
    assert proc.returncode == 0, output


def test_unit_has_the_settings_the_daemon_relies_on() -> None:
    s = service_settings(UNIT.read_text())
    assert one(s, "Type") == "notify"
    assert one(s, "NotifyAccess") == "main"  # sd_notify comes from the daemon itself
    assert one(s, "KillMode") == "mixed"  # SIGTERM to the daemon only: it drains
    # The check first: an invalid config fails `systemctl reload` and is never signalled.
    assert s["ExecReload"] == [
        f"{INSTALLED_BINARY} --config /etc/pgworkerd/pgworkerd.toml check-config --quiet",
        "/bin/kill -HUP $MAINPID",
    ]
    assert one(s, "ExecStart") == f"{INSTALLED_BINARY} --config /etc/pgworkerd/pgworkerd.toml run"
    # The daemon gives up draining drain_timeout + kill_grace + 30s after SIGTERM; systemd
    # must not SIGKILL jobs before that.
    w = WorkerConfig()
    assert timespan(one(s, "TimeoutStopSec")) > w.drain_timeout + w.kill_grace + 30
    assert one(s, "Restart") == "on-failure"
    prevent = set(one(s, "RestartPreventExitStatus").split())
    assert prevent == {str(int(code)) for code in RESTART_PREVENTING}
    assert {"3", "5", "6"} <= prevent and "4" not in prevent and "1" not in prevent
    assert timespan(one(s, "WatchdogSec")) == 30
    assert one(s, "User") == one(s, "Group") == "pgworkerd"
    # Hardening that would break forks, the fork server or PostgreSQL connections.
    assert set(one(s, "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert s.get("ProtectHome", ["no"]) in (["no"], ["read-only"])
    for harmful in ("PrivateTmp", "DynamicUser", "PrivateNetwork"):
        assert s.get(harmful, ["no"]) in (["no"], ["false"]), harmful
    assert "IPAddressDeny" not in s
    assert s.get("ProcSubset", ["all"]) == ["all"]


def test_template_matches_the_unit_except_for_the_instance() -> None:
    unit = service_settings(UNIT.read_text())
    template = service_settings(TEMPLATE.read_text())
    assert one(template, "ExecStart") == (f"{INSTALLED_BINARY} --config /etc/pgworkerd/%i.toml run")
    assert one(template, "SyslogIdentifier") == "pgworkerd@%i"
    assert template["ExecReload"][0] == (
        f"{INSTALLED_BINARY} --config /etc/pgworkerd/%i.toml check-config --quiet"
    )
    assert template["ExecReload"][1:] == unit["ExecReload"][1:]
    per_instance = {"ExecStart", "SyslogIdentifier", "ExecReload"}
    assert {k: v for k, v in template.items() if k not in per_instance} == {
        k: v for k, v in unit.items() if k not in per_instance
    }


# -- under a real systemd -----------------------------------------------------------------


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    tb = Testbed(tmp_path_factory.mktemp("sdtestbed"))
    tb.boot()
    try:
        yield tb
    finally:
        tb.teardown()


@pytest.fixture(scope="module")
def database(testbed: Testbed) -> Iterator[LocalPostgres]:
    # Our own cluster, not the session's: some tests stop it to make it unreachable.
    with LocalPostgres() as pg:
        pg.create_database(DB)
        yield pg


@contextlib.contextmanager
def database_down(pg: LocalPostgres) -> Iterator[None]:
    pg.stop()
    try:
        yield
    finally:
        pg.start()


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


WORKER = {
    "name": "sd",
    "slots": 4,
    "lease": "6s",
    "renew_interval": "1s",
    "poll_interval": "1s",
    "drain_timeout": "3s",
    "kill_grace": "2s",
    "warm_children": 1,
    "backoff": "0s",
}
HANDLERS = {
    "sleep": "pgworkerd.examples:sleep_with_progress",
    "hang": "pgworkerd.examples:hang",
}


@dataclass
class Service:
    """One test unit in the testbed running the real daemon on its own schema."""

    tb: Testbed
    pg: LocalPostgres
    unit: str
    schema: str
    config: Path
    handlers: dict[str, str] = field(default_factory=lambda: dict(HANDLERS))

    # -- setup --

    def write_config(self, handlers: dict[str, str] | None = None, extra: str = "") -> None:
        if handlers is not None:
            self.handlers = handlers
        lines = [
            "[database]",
            # LISTEN over the unix socket, everything else over TCP: both must work
            # under the unit's hardening.
            f"listen_dsn = {_toml(self.pg.dsn(DB))}",
            'connect_timeout = "2s"',
            "",
            "[worker]",
            *(f"{k} = {_toml(v)}" for k, v in WORKER.items()),
        ]
        for name, target in self.handlers.items():
            lines += ["", f"[handlers.{name}]", f"target = {_toml(target)}"]
        self.config.write_text("\n".join(lines) + "\n" + extra)

    def install(self, **overrides: str) -> None:
        dsn = f"postgresql://postgres@127.0.0.1:{self.pg.port}/{DB}?passfile={self.pg.passfile}"
        settings = {
            "ExecStart": (
                f'"{PGWORKERD}" --dsn {dsn} --schema {self.schema} --config "{self.config}" run'
            ),
            # The code of this tree, whichever checkout the venv's editable install names.
            "Environment": f'"PYTHONPATH={REPO}"',
            # The testbed has no pgworkerd user, and the venv and config are root's.
            "User": "root",
            "WatchdogSec": f"{WATCHDOG_SEC:g}s",
            "TimeoutStopSec": "60s",
            "TimeoutAbortSec": "5s",
            "RestartSec": "1s",
            # kernel.core_pattern may be a plain file name: no cores in anyone's cwd.
            "LimitCORE": "0",
            **overrides,
        }
        # The shipped ExecReload= (check, then SIGHUP) with this tree's binary and config.
        shipped = UNIT.read_text().replace(
            f"{INSTALLED_BINARY} --config /etc/pgworkerd/pgworkerd.toml check-config",
            f'"{PGWORKERD}" --config "{self.config}" check-config',
        )
        assert f'"{PGWORKERD}" --config' in shipped
        # StateDirectory would create /var/lib/pgworkerd on the host (shared file system).
        text = derive_unit(
            shipped,
            drop=("Group", "StateDirectory", "StateDirectoryMode", "WorkingDirectory"),
            **settings,
        )
        self.tb.install_unit(self.unit, text)

    # -- systemd --

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = self.tb.systemctl(*args, self.unit, check=False)
        if check and proc.returncode != 0:
            pytest.fail(
                f"systemctl {' '.join(args)} {self.unit}: exit {proc.returncode}\n"
                f"{proc.stdout}{proc.stderr}\n{self.journal()}"
            )
        return proc

    def start(self) -> None:
        self.systemctl("start")

    def prop(self, name: str) -> str:
        return self.tb.show(self.unit, name)

    def state(self) -> str:
        return self.prop("ActiveState")

    def status(self) -> str:
        return self.prop("StatusText")

    def journal(self) -> str:
        return f"--- journal of {self.unit} ---\n{self.tb.journal(self.unit)}"

    def wait(self, condition: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(
                    f"timed out after {timeout}s waiting for {what} "
                    f"(ActiveState={self.state()}, StatusText={self.status()!r})\n" + self.journal()
                )
            time.sleep(0.1)

    def holds(self, condition: Callable[[], bool], what: str, seconds: float) -> None:
        """`condition` stays true for `seconds` (checked every 0.2s)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not condition():
                pytest.fail(
                    f"{what} stopped holding (ActiveState={self.state()}, "
                    f"StatusText={self.status()!r}, NRestarts={self.prop('NRestarts')})\n"
                    + self.journal()
                )
            time.sleep(0.2)

    # -- database --

    def connect(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(self.pg.dsn(DB), autocommit=True, row_factory=dict_row)

    def enqueue(self, handler: str, payload: dict[str, Any]) -> int:
        with psycopg.connect(self.pg.dsn(DB), autocommit=True) as conn:
            return pgworkerd.enqueue(conn, handler, payload, schema=self.schema)

    def job(self, job_id: int) -> dict[str, Any]:
        with self.connect() as conn:
            row = pgworkerd.queue.admin.get(conn, job_id, schema=self.schema)
        assert row is not None
        return row

    def titles(self) -> list[str]:
        """Process titles inside the testbed (`pgworkerd: idle child`, ...)."""
        return self.tb.run("ps", "-eo", "args", "--no-headers").stdout.splitlines()

    def settled(self, job_id: int) -> bool:
        """The job runs in a child and a warm child is ready again: the daemon is idle
        between ticks. (A stop while a replacement child is still starting makes today's
        daemon wait for its exit deadline: see the report.)"""
        titles = self.titles()
        return any(t.startswith(f"pgworkerd: job {job_id} ") for t in titles) and any(
            t.startswith("pgworkerd: idle child") for t in titles
        )

    def job_status(self, job_id: int) -> str:
        return str(self.job(job_id)["status"])


@pytest.fixture
def make_service(
    testbed: Testbed, database: LocalPostgres, tmp_path: Path
) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(*, schema: bool = True, **overrides: str) -> Service:
        name = f"t_{uuid.uuid4().hex[:8]}"
        if schema:
            migrate(database.dsn(DB), schema=name)
        svc = Service(
            testbed,
            database,
            f"pgw-{name.replace('_', '-')}.service",
            name,
            tmp_path / f"{name}.toml",
        )
        svc.write_config()
        svc.install(**overrides)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        if svc.state() not in ("inactive", "failed"):
            svc.systemctl("kill", "--signal=SIGKILL", check=False)
            svc.systemctl("stop", check=False)
        print(svc.journal())  # shown by pytest when the test failed
        svc.systemctl("reset-failed", check=False)
        testbed.remove_unit(svc.unit)
        if not database.is_running():
            database.start()
        with psycopg.connect(database.dsn(DB), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(svc.schema))
            )


def test_start_returns_once_ready_and_only_when_the_database_answers(
    make_service: Callable[..., Service], database: LocalPostgres
) -> None:
    svc = make_service()
    with database_down(database):
        starter = subprocess.Popen(
            ["nsenter", "-t", str(svc.tb.pid), "-m", "-p", "--", "systemctl", "start", svc.unit],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            svc.wait(lambda: "database unreachable" in svc.status(), "STATUS=database unreachable")
            svc.holds(
                lambda: svc.state() == "activating" and starter.poll() is None,
                "activating, with `systemctl start` still waiting",
                3.0,
            )
        except BaseException:
            starter.kill()
            raise
    try:
        output, _ = starter.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        starter.kill()
        pytest.fail("systemctl start did not return after the database came back\n" + svc.journal())
    assert starter.returncode == 0, output
    # READY=1 came with the first status: nothing in between.
    assert svc.state() == "active"
    assert svc.status() == "running: 0/4 busy"
    assert svc.prop("NRestarts") == "0"


def test_status_text_follows_the_daemon(make_service: Callable[..., Service]) -> None:
    svc = make_service()
    svc.start()
    assert svc.status() == "running: 0/4 busy"
    job = svc.enqueue("sleep", {"seconds": 3})
    svc.wait(lambda: svc.status() == "running: 1/4 busy", "STATUS=running: 1/4 busy")
    # The unit's hardening leaves both transports working: TCP for the main connection,
    # the unix socket (under /tmp) for LISTEN.
    with svc.connect() as conn:
        backends = conn.execute(
            "SELECT host(client_addr) AS addr, query FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [DB],
        ).fetchall()
    assert any(b["addr"] == "127.0.0.1" for b in backends), backends
    # (the LISTEN connection's last statement: LISTEN on its own channel, schema 40)
    assert any(b["addr"] is None and "worker_wake_listen" in b["query"] for b in backends), backends
    svc.wait(lambda: svc.job_status(job) == "completed", f"job {job} completed")
    svc.wait(lambda: svc.status() == "running: 0/4 busy", "STATUS=running: 0/4 busy")


def test_stop_lets_a_running_job_finish(make_service: Callable[..., Service]) -> None:
    svc = make_service()
    svc.start()
    # `hang` ignores drain requests; sleep_with_progress would stop early (and fail).
    job = svc.enqueue("hang", {"seconds": 3})
    svc.wait(lambda: svc.status() == "running: 1/4 busy", "the job running")
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    svc.systemctl("stop", "--no-block")
    svc.wait(lambda: svc.status().startswith("draining"), "STATUS=draining")
    assert svc.state() == "deactivating"
    svc.wait(lambda: svc.state() == "inactive", "the unit stopped")
    row = svc.job(job)
    assert (row["status"], row["attempts"]) == ("completed", 1)
    assert svc.prop("Result") == "success"
    assert svc.prop("ExecMainStatus") == "0"


def test_stop_releases_a_job_longer_than_the_drain_timeout(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start()
    job = svc.enqueue("hang", {"seconds": 120})
    svc.wait(lambda: svc.settled(job), "the job in a child, a warm child ready")
    started = time.monotonic()
    svc.systemctl("stop")  # returns when the daemon has exited
    took = time.monotonic() - started
    row = svc.job(job)
    assert (row["status"], row["attempts"], row["locked_by"]) == ("pending", 0, None)
    # drain_timeout 3s + kill_grace 2s at most, and well inside TimeoutStopSec.
    assert 2.5 < took < 15, took
    assert svc.prop("Result") == "success"
    assert svc.prop("ExecMainStatus") == "0"


def test_reload_applies_a_new_config_without_touching_running_jobs(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    long = svc.enqueue("sleep", {"seconds": 5, "steps": 5})
    svc.wait(lambda: svc.job_status(long) == "running", "the long job running")
    echo = svc.enqueue("echo", {"n": 1})
    # Not served yet: two poll intervals go by without a claim.
    svc.holds(lambda: svc.job_status(echo) == "pending", "the echo job pending", 2.0)
    svc.write_config({**HANDLERS, "echo": "pgworkerd.examples:echo"})
    svc.systemctl("reload")
    # systemd 252 has no Type=notify-reload: reload returns when `kill -HUP` exits.
    svc.wait(lambda: svc.state() == "active", "the reload to finish")
    svc.wait(lambda: svc.job_status(echo) == "completed", "the newly served job completed")
    assert svc.job(echo)["result"] == {"n": 1}
    svc.wait(lambda: svc.job_status(long) == "completed", "the long job completed", 20)
    row = svc.job(long)
    # One attempt that ran through: never restarted, never resumed from a checkpoint.
    assert row["attempts"] == 1 and row["result"]["resumed_from"] == 0, row
    assert svc.prop("MainPID") == main_pid
    assert svc.prop("NRestarts") == "0"
    assert svc.state() == "active"


def test_watchdog_restarts_a_hung_daemon(make_service: Callable[..., Service]) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    # Freeze the parent: its loop stops, so do the WATCHDOG=1 pings (namespace PID).
    svc.tb.run("kill", "-STOP", main_pid, check=True)
    svc.wait(
        lambda: svc.prop("NRestarts") == "1" and svc.state() == "active",
        "a watchdog restart",
    )
    assert svc.prop("MainPID") != main_pid
    assert "Watchdog timeout" in svc.tb.journal(svc.unit)
    assert svc.status() == "running: 0/4 busy"


def test_watchdog_spares_a_daemon_waiting_for_the_database(
    make_service: Callable[..., Service], database: LocalPostgres
) -> None:
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    with database_down(database):
        svc.wait(lambda: "database unreachable" in svc.status(), "STATUS=database unreachable")
        svc.holds(
            lambda: svc.prop("NRestarts") == "0" and svc.prop("MainPID") == main_pid,
            "the daemon running through the outage",
            3 * WATCHDOG_SEC,
        )
    svc.wait(lambda: svc.status() == "running: 0/4 busy", "the daemon back to running")
    assert svc.prop("MainPID") == main_pid


def test_start_timeout_spares_a_daemon_waiting_for_the_database(
    make_service: Callable[..., Service], database: LocalPostgres
) -> None:
    svc = make_service(TimeoutStartSec="4s")
    with database_down(database):
        svc.systemctl("start", "--no-block")
        svc.wait(lambda: "database unreachable" in svc.status(), "STATUS=database unreachable")
        main_pid = svc.prop("MainPID")
        svc.holds(
            lambda: (
                svc.state() == "activating"
                and svc.prop("NRestarts") == "0"
                and svc.prop("MainPID") == main_pid
            ),
            "activating past TimeoutStartSec while retrying",
            6.0,
        )
    svc.wait(lambda: svc.state() == "active", "active once the database answers")


@pytest.mark.parametrize(
    ("broken", "code"),
    [("config", 3), ("schema", 5), ("handler", 6)],
)
def test_errors_a_restart_cannot_fix_do_not_crash_loop(
    make_service: Callable[..., Service], broken: str, code: int
) -> None:
    svc = make_service(schema=broken != "schema")
    if broken == "config":
        svc.write_config(extra="\n[bogus]\nkey = 1\n")
    elif broken == "handler":
        svc.write_config({"nope": "pgworkerd.no_such_module:handler"})
    proc = svc.systemctl("start", check=False)
    assert proc.returncode != 0
    assert svc.state() == "failed"
    assert svc.prop("ExecMainStatus") == str(code)
    # RestartSec=1s: a restart would have come by now.
    svc.holds(lambda: svc.prop("NRestarts") == "0", "no restart", 2.0)
    assert svc.state() == "failed"


def test_reload_with_an_invalid_config_fails_and_says_so(
    make_service: Callable[..., Service],
) -> None:
    """`systemctl reload` used to answer rc 0 and "Reloaded" for any config, with the
    daemon's STATUS= unchanged. Now the unit's check fails the reload; should the daemon
    be signalled anyway, its STATUS= says the reload failed, and its error line reaches
    the journal as priority 3 (every line used to be 6, invisible to -p warning)."""
    svc = make_service()
    svc.start()
    main_pid = svc.prop("MainPID")
    good = svc.config.read_text()
    svc.config.write_text(good.replace("slots = 4", "slots = 0"))
    proc = svc.systemctl("reload", check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    journal = svc.tb.journal(svc.unit)
    assert "worker.slots: must be at least 1" in journal, journal
    svc.wait(lambda: svc.state() == "active", "the unit active again")
    assert svc.status() == "running: 0/4 busy"  # the daemon was never signalled
    # A failure only the daemon sees (the check passed, or someone sent SIGHUP itself).
    svc.systemctl("kill", "--kill-who=main", "--signal=SIGHUP")
    svc.wait(lambda: "reload failed" in svc.status(), "STATUS=... reload failed")
    assert svc.status().startswith("running: 0/4 busy; reload failed: ")
    assert "worker.slots: must be at least 1" in svc.status()

    def priority_lines(priority: str) -> str:
        return svc.tb.run(
            "journalctl", "-u", svc.unit, "-p", priority, "--no-pager", "-o", "cat"
        ).stdout

    svc.wait(
        lambda: "reload failed, keeping the old config" in priority_lines("err"),
        "the error in `journalctl -p err`",
    )
    # The check's own message (from ExecReload=) is an error too.
    assert "worker.slots: must be at least 1" in priority_lines("err")
    warnings_and_worse = priority_lines("warning")
    assert "running as" not in warnings_and_worse  # INFO stays 6
    # One timestamp per line: journald's own, none from the daemon.
    for line in priority_lines("info").splitlines():
        assert not re.match(r"\d{4}-\d\d-\d\dT", line), line
    # Fixed config: reload succeeds and the failure leaves STATUS=.
    svc.config.write_text(good)
    svc.systemctl("reload")
    svc.wait(lambda: svc.status() == "running: 0/4 busy", "STATUS without the failure")
    assert svc.prop("MainPID") == main_pid and svc.prop("NRestarts") == "0"

"""Unit tests of the TOML config (no database): values, defaults, and errors that name the
file, the key and the line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pgworkerd.config import Config, ConfigError, effective, load_config, parse_config
from pgworkerd.durations import parse_duration
from pgworkerd.exitcodes import ExitCode

PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))
REPO = Path(__file__).resolve().parents[2]


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/pgworkerd.toml")
    return str(info.value)


def test_defaults_when_empty() -> None:
    config = parse_config("", "x.toml")
    assert config.worker.slots == 4
    assert config.worker.lease == 60.0
    assert config.worker.max_jobs_per_child == 1
    assert config.database.schema == "pgworkerd"
    assert config.handlers == {}


def test_values_and_durations_are_read() -> None:
    config = parse_config(
        """
[worker]
slots = 8
lease = "2m"
renew_interval = "20s"
queues = ["default", "mail"]

[handlers.send]
target = "myapp.jobs:send_mail"
queue = "mail"
timeout = "1h30m"
heartbeat_timeout = "5m"
slots = 2
max_attempts = 3
""",
        "x.toml",
    )
    assert config.worker.lease == 120.0
    handler = config.handlers["send"]
    assert handler.timeout == 5400.0
    assert handler.heartbeat_timeout == 300.0
    assert handler.slots == 2
    assert handler.max_attempts == 3
    assert config.queues == ("default", "mail")
    assert config.lease_for(handler) == 120.0


def test_queues_default_to_the_handlers_queues() -> None:
    config = parse_config(
        '[handlers.a]\ntarget = "m:f"\nqueue = "q1"\n[handlers.b]\ntarget = "m:g"\n', "x"
    )
    assert config.queues == ("default", "q1")


def test_syntax_error_names_file_and_line() -> None:
    message = error_of("[worker]\nslots = 4\nlease = \n")
    assert message.startswith("/etc/pgworkerd.toml: invalid TOML")
    assert "line 3" in message


def test_wrong_type_names_key_and_line() -> None:
    message = error_of('[worker]\n\nslots = "four"\n')
    assert message.startswith("/etc/pgworkerd.toml:3: worker.slots:")
    assert "integer" in message


def test_unknown_key_names_key_line_and_known_keys() -> None:
    message = error_of("[worker]\nslots = 2\nslotz = 3\n")
    assert message.startswith("/etc/pgworkerd.toml:3: worker.slotz: unknown key")
    assert "slots" in message


def test_unknown_table() -> None:
    assert "[workers]: unknown table" in error_of("[workers]\nslots = 2\n")


def test_bad_duration() -> None:
    message = error_of('[worker]\nlease = "10 minutes"\n')
    assert message.startswith("/etc/pgworkerd.toml:2: worker.lease:")
    assert '"30s"' in message


def test_zero_lease_rejected() -> None:
    assert "worker.lease: must be longer than zero" in error_of('[worker]\nlease = "0s"\n')


def test_stop_grace_defaults_to_30s_and_a_handler_s_own_wins() -> None:
    config = parse_config(
        '[worker]\nstop_grace = "45s"\n[handlers.a]\ntarget = "m:f"\nstop_grace = "0"\n'
        '[handlers.b]\ntarget = "m:g"\n'
    )
    assert Config().worker.stop_grace == 30.0
    assert config.stop_grace_for(config.handlers["a"]) == 0.0
    assert config.stop_grace_for(config.handlers["b"]) == 45.0


@pytest.mark.parametrize("value", ['"3650d"', '"25h"', "-1"])
def test_stop_grace_is_bounded(value: str) -> None:
    message = error_of(f"[worker]\nstop_grace = {value}\n")
    assert "worker.stop_grace:" in message
    message = error_of(f'[handlers.h]\ntarget = "m:f"\nstop_grace = {value}\n')
    assert "handlers.h.stop_grace:" in message


def test_handler_needs_a_target_in_module_function_form() -> None:
    assert 'handlers.h]: missing key "target"' in error_of("[handlers.h]\nqueue = 'x'\n")
    message = error_of('[handlers.h]\ntarget = "not a path"\n')
    assert message.startswith("/etc/pgworkerd.toml:2: handlers.h.target:")


def test_renew_interval_must_be_well_below_the_lease() -> None:
    message = error_of('[worker]\nlease = "30s"\nrenew_interval = "15s"\n')
    assert message.startswith("/etc/pgworkerd.toml:3: worker.renew_interval:")
    assert "third of the lease" in message
    # a handler's shorter lease counts too
    message = error_of(
        '[worker]\nrenew_interval = "10s"\n[handlers.h]\ntarget = "m:f"\nlease = "20s"\n'
    )
    assert "handlers.h" in message


def test_handler_queue_must_be_served() -> None:
    message = error_of('[worker]\nqueues = ["a"]\n[handlers.h]\ntarget = "m:f"\nqueue = "b"\n')
    assert message.startswith("/etc/pgworkerd.toml:5: handlers.h.queue:")


def test_handler_slots_cannot_exceed_worker_slots() -> None:
    message = error_of('[worker]\nslots = 2\n[handlers.h]\ntarget = "m:f"\nslots = 3\n')
    assert "handlers.h.slots: 3 exceeds worker.slots (2)" in message


def test_effective_config_masks_passwords() -> None:
    config = parse_config(
        '[database]\ndsn = "postgresql://app:s3cret@db:5432/app"\n'
        'listen_dsn = "host=db password=s3cret user=app"\n',
        "x",
    )
    text = json.dumps(effective(config))
    assert "s3cret" not in text
    assert "app:***@db" in text


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("10m", 600.0), ("1h30m", 5400.0), ("250ms", 0.25), ("2", 2.0), (5, 5.0)],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10 minutes", "s", "-5s", "1x"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_example_config_is_valid_and_documents_every_key() -> None:
    example = REPO / "config.example.toml"
    config = load_config(example)
    assert isinstance(config, Config)
    text = example.read_text()
    import dataclasses

    from pgworkerd.config import (
        DatabaseConfig,
        HandlerConfig,
        LoggingConfig,
        MetricsConfig,
        RetentionConfig,
        WebConfig,
        WorkerConfig,
    )

    for cls in (
        DatabaseConfig,
        WorkerConfig,
        LoggingConfig,
        MetricsConfig,
        HandlerConfig,
        RetentionConfig,
        WebConfig,
    ):
        for f in dataclasses.fields(cls):
            if f.name != "name" or cls is WorkerConfig:
                assert f"{f.name} =" in text, f"{cls.__name__}.{f.name} undocumented"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PGWORKERD, *args], capture_output=True, text=True, timeout=60)


def test_check_config_prints_effective_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[database]\ndsn = "host=db password=hunter2"\n'
        '[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n'
    )
    proc = run_cli("--config", str(cfg), "check-config")
    assert proc.returncode == 0, proc.stderr
    assert "[handlers.echo]" in proc.stdout
    assert "hunter2" not in proc.stdout + proc.stderr
    data = json.loads(run_cli("--config", str(cfg), "check-config", "--json").stdout)
    assert data["handlers"]["echo"]["target"] == "pgworkerd.examples:echo"


def test_check_config_bad_config_exit_code(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[worker]\nslots = 0\n")
    proc = run_cli("--config", str(cfg), "check-config")
    assert proc.returncode == ExitCode.CONFIG
    assert f"{cfg}:2: worker.slots: must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_config_handler_that_does_not_import(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[handlers.h]\ntarget = "no_such_module_xyz:run"\n')
    proc = run_cli("--config", str(cfg), "check-config")
    assert proc.returncode == ExitCode.HANDLER
    assert "cannot import 'no_such_module_xyz'" in proc.stderr
    assert "Traceback" not in proc.stderr
    cfg.write_text('[handlers.h]\ntarget = "pgworkerd.examples:no_such_function"\n')
    proc = run_cli("--config", str(cfg), "check-config")
    assert proc.returncode == ExitCode.HANDLER
    assert "has no function 'no_such_function'" in proc.stderr


# -- trust boundaries: nesting, secrets in messages, file permissions (issue 9) -------------


def test_deeply_nested_toml_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    """tomllib recurses per bracket: 3,000 of them used to end in a RecursionError
    traceback and exit 1, which systemd restarts forever."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("queues = " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(cfg)
    for command in ("check-config", "run"):
        proc = run_cli("--config", str(cfg), command)
        assert proc.returncode == ExitCode.CONFIG, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"{cfg}: invalid TOML: nested too deeply" in proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_type_errors_never_echo_a_table_or_a_password() -> None:
    message = error_of('[database]\ndsn = { host = "x", password = "Typo-Table-Pw2" }\n')
    assert "database.dsn: expected a string, got a table" in message
    assert "Typo-Table-Pw2" not in message
    message = error_of('[database]\nlisten_dsn = ["host=x password=Arr-Pw3"]\n')
    assert "expected a string, got an array" in message
    assert "Arr-Pw3" not in message


@pytest.mark.parametrize(
    ("dsn", "secrets"),
    [
        ("postgresql://u:Xy%9kLmq@h/app", ["Xy%9kLmq", "9kLmq"]),
        ("postgresql://u:Pw X4@h/app", ["Pw X4", "Pw", "X4"]),
        ("postgres://u:Pw%zz@h:5432/app?sslmode=require", ["Pw%zz"]),
        ("postgresql://u:Q%41b C@h:bad/app", ["Q%41b", "QAb", "b C"]),
        ("host=h password='unterminated-Pw5 user=u", ["unterminated-Pw5"]),
    ],
)
def test_malformed_dsns_never_echo_the_password(
    tmp_path: Path, dsn: str, secrets: list[str]
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n')
    proc = run_cli("--dsn", dsn, "--config", str(cfg), "run")
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert "invalid DSN" in proc.stderr and "Traceback" not in proc.stderr
    for secret in secrets:
        assert secret not in proc.stderr, proc.stderr


def _warnings_of(cfg: Path) -> str:
    proc = run_cli("--config", str(cfg), "check-config")
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_config_with_a_password_readable_by_others_gets_a_warning(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[database]\ndsn = "postgresql://app:Rd-Pw7@db/app"\n')
    cfg.chmod(0o644)
    warning = _warnings_of(cfg)
    assert f"WARNING: {cfg} holds a database password and is readable by others" in warning
    assert f"chmod 600 {cfg}" in warning
    assert "Rd-Pw7" not in warning
    cfg.chmod(0o600)
    assert _warnings_of(cfg) == ""
    # Readable by a group the daemon is not in: that group's members can read it.
    cfg.chmod(0o640)
    os.chown(cfg, -1, 65534 if os.getgid() != 65534 else 0)
    assert "readable by group" in _warnings_of(cfg)
    # Without a password, being readable is fine.
    cfg.write_text('[database]\ndsn = "postgresql://app@db/app"\n')
    cfg.chmod(0o644)
    assert _warnings_of(cfg) == ""


def test_config_others_can_write_gets_a_warning(tmp_path: Path) -> None:
    directory = tmp_path / "etc"
    directory.mkdir()
    cfg = directory / "c.toml"
    cfg.write_text('[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n')
    cfg.chmod(0o666)
    assert f"WARNING: {cfg} is writable by others" in _warnings_of(cfg)
    cfg.chmod(0o644)
    directory.chmod(0o777)  # others can replace the file (and with it the handlers' code)
    assert f"WARNING: {cfg} is in {directory}, which others can write" in _warnings_of(cfg)
    directory.chmod(0o1777)  # sticky: only the file's owner may replace it
    assert _warnings_of(cfg) == ""
    directory.chmod(0o755)
    assert _warnings_of(cfg) == ""


def test_check_config_quiet_prints_only_problems(tmp_path: Path) -> None:
    """For ExecReload=: nothing on success, the error (exit 3) on failure."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n')
    proc = run_cli("--config", str(cfg), "check-config", "--quiet")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    cfg.write_text("[worker]\nslots = 0\n")
    proc = run_cli("--config", str(cfg), "check-config", "--quiet")
    assert proc.returncode == ExitCode.CONFIG and "worker.slots" in proc.stderr


@pytest.mark.parametrize(
    "dsn, secret",
    [
        ("postgresql://u:pa ss@h/db", "pa ss"),  # libpq cannot parse it
        ("postgresql://u:pq%9kLm@h/db", "pq%9kLm"),  # nor a bad percent escape
        ("postgresql://u:p@ss@h/db", "p@ss"),  # an unescaped @ inside the password
        ("host=h password=Pw X4secret dbname=app", "X4secret"),  # a space, unquoted
    ],
)
def test_check_config_masks_a_malformed_dsn_and_refuses_it(
    tmp_path: Path, dsn: str, secret: str
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[database]\ndsn = "{dsn}"\n[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n'
    )
    cfg.chmod(0o600)
    proc = run_cli("--config", str(cfg), "check-config")
    out = proc.stdout + proc.stderr
    assert secret not in out and "u:p" not in out, out
    if proc.returncode == 0:
        assert 'dsn = "postgresql://u:***@h/db"' in out or "password=***" in out, out
    else:  # what `run` refuses, check-config refuses the same way
        assert proc.returncode == ExitCode.CONFIG, out
        assert "database.dsn" in out


# -- handler-controlled outcomes (issue 11) -----------------------------------------------


def test_no_retry_and_max_snoozes_are_read_and_checked() -> None:
    base = '[handlers.h]\ntarget = "m:f"\n'
    config = parse_config(base + 'no_retry = ["ValueError", "a.b.C"]\nmax_snoozes = 0\n')
    assert config.handlers["h"].no_retry == ("ValueError", "a.b.C")
    assert config.handlers["h"].max_snoozes == 0
    assert parse_config(base).handlers["h"].max_snoozes == 100
    for bad, what in (
        ('no_retry = ["not a name"]', "exception type names"),
        ('no_retry = "ValueError"', "list"),
        ('no_retry = ["a..b"]', "exception type names"),
        ("max_snoozes = -1", ">= 0"),
        ("max_snoozes = 1000001", "at most 1000000"),
    ):
        message = error_of(base + bad + "\n")
        assert message.startswith("/etc/pgworkerd.toml:3: handlers.h."), message
        assert what in message, message


def test_retention_keys_off_zero_and_errors_naming_the_key() -> None:
    from pgworkerd.config import RetentionConfig, parse_config

    assert parse_config("").retention == RetentionConfig()
    config = parse_config('[retention]\ncompleted = "off"\ncancelled = 0\ndead = "90d"\n')
    assert (config.retention.completed, config.retention.cancelled) == (None, None)
    assert config.retention.dead == 90 * 86400.0 and config.retention.enabled
    off = parse_config('[retention]\ncompleted = "off"\ncancelled = "off"\ndead = "OFF"\n')
    assert off.retention.enabled  # schedule runs and gone daemons still 7 days
    assert (off.retention.schedule_runs, off.retention.gone_daemons) == (7 * 86400.0,) * 2
    off = parse_config(
        '[retention]\ncompleted = "off"\ncancelled = "off"\ndead = "OFF"\n'
        'schedule_runs = "off"\ngone_daemons = 0\n'
    )
    assert not off.retention.enabled
    both = parse_config('[retention]\nschedule_runs = "1d"\ngone_daemons = "12h"\n').retention
    assert (both.schedule_runs, both.gone_daemons) == (86400.0, 43200.0)
    for text, where in (
        ('[retention]\ncompleted = "soon"\n', "<config>:2: retention.completed:"),
        ('[retention]\nschedule_runs = "-1d"\n', "<config>:2: retention.schedule_runs:"),
        ("[retention]\ngone_daemons = true\n", "<config>:2: retention.gone_daemons:"),
        ('[retention]\ngone_daemons = "1000y"\n', "<config>:2: retention.gone_daemons:"),
        ("[retention]\nbatch = 0\n", "<config>:2: retention.batch:"),
        ("[retention]\nbatch = 20000\n", "<config>:2: retention.batch: must be at most"),
        ('[retention]\ninterval = "0s"\n', "<config>:2: retention.interval:"),
        ("[retention]\nkeep = 1\n", "<config>:2: retention.keep: unknown key"),
    ):
        with pytest.raises(ConfigError, match=re.escape(where)):
            parse_config(text)


def test_logs_keys_defaults_and_bounds() -> None:
    from pgworkerd.config import LogsConfig, parse_config

    assert parse_config("").logs == LogsConfig(True, 1 << 20, 100)
    config = parse_config(
        '[logs]\ncapture = false\nmax_bytes_per_attempt = "64KiB"\nforward_lines_per_second = 0\n'
    )
    assert config.logs == LogsConfig(False, 64 << 10, 0)


def test_check_config_shows_a_retention_that_is_off(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[retention]\ndead = "off"\n[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n'
    )
    proc = run_cli("--config", str(cfg), "check-config")
    assert proc.returncode == 0, proc.stderr
    assert '[retention]\ncompleted = 604800.0\ncancelled = 604800.0\ndead = "off"' in proc.stdout
    data = json.loads(run_cli("--config", str(cfg), "check-config", "--json").stdout)
    assert data["retention"]["dead"] is None and data["retention"]["completed"] == 604800.0


def test_web_users_hashes_readable_by_others_get_a_warning(tmp_path: Path) -> None:
    from pgworkerd.web.passwords import hash_password

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[web.users]\nalice = "{hash_password("a long password")}"\n')
    cfg.chmod(0o644)
    warning = _warnings_of(cfg)
    assert f"WARNING: {cfg} holds [web.users] password hashes and is readable by others" in (
        warning
    )
    assert "scrypt$" not in warning  # the hash itself is never shown
    cfg.chmod(0o600)
    assert "password hashes" not in _warnings_of(cfg)


# -- [worker] job_uids ----------------------------------------------------------------------


def test_job_uids_is_a_range_shown_as_written() -> None:
    config = parse_config('[worker]\njob_uids = "61000-61063"\n', "x.toml")
    assert config.worker.job_uids == (61000, 61063)
    assert effective(config)["worker"]["job_uids"] == "61000-61063"
    assert parse_config("", "x.toml").worker.job_uids is None  # the default: one uid


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"61000"', "uid range like"),
        ('"61063-61000"', "first uid is above the last"),
        ('"0-63"', "within 1000-65533"),
        ('"65000-65534"', "within 1000-65533"),
        ("61000", "expected a string"),
        ('"61000-61004"', "5 uid(s) for 6 children at once (slots 4 + warm_children 2)"),
    ],
)
def test_job_uids_refused_with_the_reason(value: str, says: str) -> None:
    message = error_of(f"[worker]\njob_uids = {value}\n")
    assert "worker.job_uids" in message and says in message, message


def test_job_uids_must_not_hold_an_account_or_group() -> None:
    import grp
    import pwd

    nobody_like = [u for u in pwd.getpwall() if 1000 <= u.pw_uid <= 65533]
    groups = [g for g in grp.getgrall() if 1000 <= g.gr_gid <= 65533]
    if not nobody_like and not groups:
        pytest.skip("no account or group with an id in 1000-65533 on this machine")
    taken = nobody_like[0].pw_uid if nobody_like else groups[0].gr_gid
    message = error_of(f'[worker]\njob_uids = "{taken}-{min(taken + 63, 65533)}"\n')
    assert "worker.job_uids" in message and "choose a range no account" in message, message

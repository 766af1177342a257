"""Unit tests of the TOML config (no database): values, defaults, and errors that name the
file, the key and the line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgworkerd.config import Config, ConfigError, effective, load_config, parse_config
from pgworkerd.durations import parse_duration
from pgworkerd.exitcodes import ExitCode

PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))
REPO = Path(__file__).resolve().parent.parent


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
        WorkerConfig,
    )

    for cls in (DatabaseConfig, WorkerConfig, LoggingConfig, MetricsConfig, HandlerConfig):
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

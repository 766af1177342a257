"""The TOML configuration, declared once: each key's type, default, check (its bounds)
and help live beside its field (`key(...)`), and everything else reads them.

  spec.py       how a key and a table are declared (`key`, `Table`, `ConfigError`)
  checks.py     value checks: what a key takes, its error messages, how it is written
  tables.py     [database] [worker] [logging] [metrics] [retention] [logs] [web] [tracing]
  handlers.py   [handlers.NAME] and [schedules.NAME], and importing a handler
  webusers.py   [web.users]: the dashboard's password hashes, checked, never shown
  model.py      `Config` and the list of tables
  load.py       reading a file: file:line: table.key: what is wrong and what is allowed
  relations.py  the checks between keys (renew_interval against every lease, ...)
  audit.py      the file's permissions (warnings)
  show.py       the effective config `check-config` prints, secrets masked
  docs.py       config.example.toml and docs/reference/configuration.md, generated

A new key is one `key(...)` field in its table's dataclass (and, when it relates to
others, a check in relations.py); then `python -m pgworkerd.config.docs --write`.
"""

from pgworkerd.config.audit import file_warnings
from pgworkerd.config.checks import is_loopback, split_listen, stop_grace_problem
from pgworkerd.config.handlers import HandlerConfig, ScheduleConfig, import_handler
from pgworkerd.config.load import load_config, parse_config
from pgworkerd.config.model import Config
from pgworkerd.config.show import effective
from pgworkerd.config.spec import ConfigError
from pgworkerd.config.tables import (
    DatabaseConfig,
    LoggingConfig,
    LogsConfig,
    MetricsConfig,
    RetentionConfig,
    TracingConfig,
    WebConfig,
    WorkerConfig,
)

__all__ = [
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "HandlerConfig",
    "LoggingConfig",
    "LogsConfig",
    "MetricsConfig",
    "RetentionConfig",
    "ScheduleConfig",
    "TracingConfig",
    "WebConfig",
    "WorkerConfig",
    "effective",
    "file_warnings",
    "import_handler",
    "is_loopback",
    "load_config",
    "parse_config",
    "split_listen",
    "stop_grace_problem",
]

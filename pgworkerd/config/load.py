"""Reading the file: TOML parsed, each table read by one generic reader from its declared
keys (spec.keys_of), errors naming the file, the line, the key, what is wrong and what is
allowed, then the relations between keys (relations.py).

tomllib gives no positions, so errors locate keys with a small scan of the text (tables
and `key =` lines); good enough to point an operator at the right line.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from pgworkerd.bounds import PAYLOAD_DEPTH_MAX, name_problem, payload_too_deep
from pgworkerd.config.handlers import HandlerConfig, ScheduleConfig
from pgworkerd.config.model import TABLES, Config
from pgworkerd.config.relations import cross_check
from pgworkerd.config.spec import ConfigError, Table, keys_of
from pgworkerd.jsontext import storable_json

_TABLE_RE = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*(\"[^\"]*\"|[A-Za-z0-9_-]+)\s*=")


def locate(text: str, table: str, key: str | None) -> int | None:
    """Line number of `key` inside `[table]` (or of the table header when key is None;
    failing that, of a `table = ...` line in the parent table, or of a `[table.sub]`)."""
    current = ""
    header_line = None
    parent, _, last = table.rpartition(".")
    for number, line in enumerate(text.splitlines(), 1):
        m = _TABLE_RE.match(line)
        if m:
            current = ".".join(p.strip().strip('"') for p in m[1].split("."))
            if header_line is None and (
                current == table or (key is None and current.startswith(table + "."))
            ):
                header_line = number
            continue
        if key is None and header_line is None and current == parent:
            k = _KEY_RE.match(line)
            if k and k[1].strip('"') == last:
                header_line = number
        if key is not None and current == table:
            k = _KEY_RE.match(line)
            if k and k[1].strip('"') == key:
                return number
    return header_line


def error_at(path: str, text: str, table: str, key: str | None, message: str) -> ConfigError:
    """`path:line: table.key: message` (`[table]` when the table itself is wrong)."""
    line = locate(text, table, key)
    where = f"{path}:{line}" if line else path
    name = f"{table}.{key}" if key else f"[{table}]"
    return ConfigError(f"{where}: {name}: {message}")


class _Reader:
    """One table of the parsed TOML and where its errors point."""

    def __init__(self, path: str, text: str, table: str, values: Any) -> None:
        self.path, self.text, self.table = path, text, table
        if not isinstance(values, dict):
            raise self.error(None, "must be a table")
        self.values: dict[str, Any] = values

    def error(self, key: str | None, message: str) -> ConfigError:
        return error_at(self.path, self.text, self.table, key, message)


def _require(reader: _Reader, cls: type) -> None:
    for k in keys_of(cls):
        if k.required and k.name not in reader.values:
            raise reader.error(None, f'missing key "{k.name}" ({k.check.allowed})')


def _read_table(reader: _Reader, cls: type, **fixed: Any) -> Any:
    """A table's dataclass from its declared keys: each present key checked (absent ones
    keep their default), a missing required key or an unknown one named."""
    _require(reader, cls)
    declared = keys_of(cls)
    kwargs = {}
    for k in declared:
        if k.name in reader.values:
            try:
                kwargs[k.name] = k.check(reader.values[k.name])
            except (TypeError, ValueError) as exc:
                raise reader.error(k.name, str(exc)) from None
    known = sorted(k.name for k in declared)
    unknown = sorted(set(reader.values) - set(known))
    if unknown:
        raise reader.error(unknown[0], f"unknown key (known keys here: {', '.join(known)})")
    return cls(**fixed, **kwargs)


def _named_tables(path: str, text: str, table: Table, value: Any) -> dict[str, _Reader]:
    """The [table.NAME] tables, each NAME checked as enqueue would check a handler name
    (repr in the message: the name may hold control characters)."""
    if not isinstance(value, dict):
        line = locate(text, table.name, None)
        where = f"{path}:{line}" if line else path
        raise ConfigError(f"{where}: [{table.name}] must be a table of [{table.name}.NAME] tables")
    readers = {}
    kind = table.name.removesuffix("s")
    for name, values in value.items():
        problem = name_problem(kind, name)
        if problem:
            line = locate(text, f"{table.name}.{name}", None)
            raise ConfigError(f"{path}:{line or '?'}: [{table.name}.{name!r}]: {problem}")
        readers[name] = _Reader(path, text, f"{table.name}.{name}", values)
    return readers


def _schedule(reader: _Reader, name: str, handlers: dict[str, HandlerConfig]) -> ScheduleConfig:
    values = reader.values
    _require(reader, ScheduleConfig)
    if ("cron" in values) == ("every" in values):
        raise reader.error(
            None,
            'needs exactly one of "cron" (with "timezone") or "every", not '
            + ("both" if "cron" in values else "neither"),
        )
    if "timezone" in values and "cron" not in values:
        raise reader.error("timezone", 'applies to "cron" only (an interval has no zone)')
    if "dedupe_window" in values and "dedupe_key" not in values:
        raise reader.error("dedupe_window", 'needs "dedupe_key" (the key it holds)')
    schedule: ScheduleConfig = _read_table(reader, ScheduleConfig, name=name)
    if not schedule.queue:
        declared = handlers.get(schedule.handler)
        queue = declared.queue if declared is not None else "default"
        schedule = dataclasses.replace(schedule, queue=queue)
    # What enqueue would refuse fails every tick, forever: refused here instead. JSON
    # that jsonb stores (TOML dates are not JSON; a NUL character jsonb cannot hold).
    try:
        storable_json(schedule.payload)
    except (TypeError, ValueError) as exc:
        raise reader.error("payload", f"not JSON: {exc}") from None
    if payload_too_deep(schedule.payload):
        raise reader.error("payload", f"nested deeper than {PAYLOAD_DEPTH_MAX} levels")
    return schedule


def parse_config(text: str, path: str = "<config>") -> Config:
    """Parse and validate a config text; raises ConfigError naming file, key and line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        # tomllib recurses once per nested array or inline table.
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    known_tables = [t.name for t in TABLES]
    for table_name, value in data.items():
        if table_name not in known_tables:
            line = locate(text, table_name, None)
            if isinstance(value, dict):
                what = f"[{table_name}]: unknown table"
            else:
                what = f"{table_name}: unknown top-level key"
            raise ConfigError(f"{path}:{line or '?'}: {what} (known: {', '.join(known_tables)})")
    tables: dict[str, Any] = {}
    for table in TABLES:
        value = data.get(table.name, {})
        if not table.named:
            tables[table.name] = _read_table(_Reader(path, text, table.name, value), table.cls)
        elif table.cls is HandlerConfig:
            readers = _named_tables(path, text, table, value)
            tables[table.name] = {
                name: _read_table(reader, HandlerConfig, name=name)
                for name, reader in readers.items()
            }
        else:  # schedules: after handlers, whose queues they default to
            readers = _named_tables(path, text, table, value)
            tables[table.name] = {
                name: _schedule(reader, name, tables["handlers"])
                for name, reader in readers.items()
            }
    config = Config(path, **tables)

    def relation_error(table: str, key: str, message: str) -> ConfigError:
        line = locate(text, table, key)
        return ConfigError(f"{path}:{line or '?'}: {table}.{key}: {message}")

    cross_check(config, relation_error)
    return config


def load_config(path: str | Path) -> Config:
    """Read and validate a config file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")  # TOML is UTF-8 whatever the locale says
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p}:{line}: not UTF-8 text (TOML must be UTF-8): byte 0x{data[exc.start]:02x}"
        ) from None
    return parse_config(text, str(p))

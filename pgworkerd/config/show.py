"""The effective configuration as `check-config` shows it: every table, every key, secrets
masked by what each key declares (`shown`: DSN passwords, the dashboard's hashes)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pgworkerd.config.model import TABLES, Config
from pgworkerd.config.spec import Key


def _shown(k: Key, value: Any) -> Any:
    return value if value is None or k.shown is None else k.shown(value)


def effective(config: Config) -> dict[str, Any]:
    """The effective config as plain data, secrets masked (for check-config)."""
    data = dataclasses.asdict(config)
    for table in TABLES:
        for k in table.declared():
            if table.named:
                for name, entry in data[table.name].items():
                    entry[k.name] = _shown(k, getattr(getattr(config, table.name)[name], k.name))
            else:
                data[table.name][k.name] = _shown(k, getattr(getattr(config, table.name), k.name))
    data["worker"]["queues"] = list(config.queues)  # the queues served, whoever named them
    return data


def effective_text(config: Config) -> list[str]:
    """The lines `check-config` prints: each table's keys with their effective values (as
    JSON, seconds for durations); a key without a value is shown as a comment, a
    retention that is off as "off"."""
    data = effective(config)
    lines = []
    for table in TABLES:
        entries = data[table.name].items() if table.named else [(None, data[table.name])]
        for name, values in entries:
            lines.append(f"[{table.name}.{name}]" if table.named else f"[{table.name}]")
            for k in table.declared():
                value = values[k.name]
                if value is None and k.check.unset is not None:
                    value = k.check.unset  # "off"
                if value is not None:
                    lines.append(f"{k.name} = {json.dumps(value)}")
                elif not table.named:  # a handler's unset key is the worker's: left out
                    lines.append(f"# {k.name}: not set")
    return lines

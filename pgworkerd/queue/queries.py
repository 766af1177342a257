"""All SQL statements in one registry: the files of `sql/queries/` (one per entity: jobs,
workers, schedules, ...) split by their `-- name:` headers, each name defined once.

Statements are rendered once per schema name (the schema is configurable, so it cannot be
a bind parameter) and cached; callers pass the rendered text to psycopg. Free of psycopg
itself: config and the metrics endpoint import it for the schema name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from importlib import resources

from pgworkerd.names import DEFAULT_SCHEMA, check_schema_name  # re-exported here too

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def render(text: str, schema: str) -> str:
    """Substitute the schema placeholders of a SQL text."""
    # A checked name holds no quote, backslash or upper case: quoting it is just wrapping.
    check_schema_name(schema)
    return (
        text.replace("@schema_literal@", f"'{schema}'")
        .replace("@notify_channel@", f'"{notify_channel(schema)}"')
        .replace("@finished_channel@", f'"{finished_channel(schema)}"')
        .replace("@wake_channel@", f'"{wake_channel(schema)}"')
        .replace("@schema@", f'"{schema}"')
    )


def _split(text: str) -> dict[str, str]:
    parts = _NAME_RE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    statements = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.startswith("-- ")]
        statements[name] = "\n".join(lines).strip().rstrip(";")
    return statements


@functools.cache
def _raw() -> dict[str, str]:
    return _registry(
        (entry.name, entry.read_text())
        for entry in resources.files("pgworkerd.queue").joinpath("sql/queries").iterdir()
        if entry.name.endswith(".sql")
    )


def _registry(files: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Every statement of `files` (file name, text) by name; a name defined twice, in one
    file or in two, is an error that names both places."""
    statements: dict[str, str] = {}
    where: dict[str, str] = {}
    for file_name, text in sorted(files):
        for name in _NAME_RE.findall(text):
            if name in where:
                raise ValueError(
                    f"statement {name!r} is defined in {where[name]} and again in "
                    f"{file_name}: a name is defined once"
                )
            where[name] = file_name
        statements.update(_split(text))
    return statements


@functools.cache
def query(name: str, schema: str = DEFAULT_SCHEMA) -> str:
    """The statement called `name`, rendered for `schema`."""
    return render(_raw()[name], schema)


def notify_channel(schema: str) -> str:
    """The NOTIFY channel enqueue signals on (see enqueue_many in the migrations)."""
    return f"{check_schema_name(schema)}.jobs"


def finished_channel(schema: str) -> str:
    """The NOTIFY channel a job's final status is announced on, the job id as payload
    (the trigger of migration "outcomes"; pgworkerd.wait listens on it)."""
    return f"{check_schema_name(schema)}.finished"


def wake_channel(schema: str) -> str:
    """The NOTIFY channel of targeted wake-ups (migration "wake"; daemon/peers.py): new
    jobs, peers coming and going, drain requests, forwarded wake-ups."""
    return f"{check_schema_name(schema)}.wake"

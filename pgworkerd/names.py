"""The schema name: its default and what a valid one looks like (dependency-free, so the
config can check it without loading the SQL core; pgworkerd.queue.queries re-uses it)."""

from __future__ import annotations

import re

DEFAULT_SCHEMA = "pgworkerd"
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    """Schema names are restricted to plain lower-case identifiers: no quoting surprises."""
    if not _SCHEMA_RE.match(schema):
        raise ValueError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and _ "
            "(at most 63, not starting with a digit)"
        )
    return schema

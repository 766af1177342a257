"""Records built from a statement's result columns by name, never by position.

A record is a dataclass whose fields are named as the result columns of the statement it
is built from (sql/queries/ aliases a column where the record's name differs, e.g.
`lease_token AS token`). `@built_from("job_claim")` registers the pair: the column
contract test (tests/integration/test_column_contract.py) describes every registered
statement on a real server and holds its columns, by name and in order, to the record's
fields. At run time `build` maps each field to the column of that name (the positions are
worked out once per record and column list), so a reordered column lands in the right
field, and a missing one is a clear error naming the statement's columns, not a silent
mix-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

R = TypeVar("R")

# statement name (sql/queries/) -> the record built from its rows
REGISTRY: dict[str, type[Any]] = {}


def built_from(*statements: str) -> Callable[[type[R]], type[R]]:
    """Class decorator: the record is built from the rows of `statements` (by column name)."""

    def register(cls: type[R]) -> type[R]:
        for name in statements:
            if name in REGISTRY:
                raise ValueError(f"statement {name} has a record already: {REGISTRY[name]}")
            REGISTRY[name] = cls
        return cls

    return register


def field_names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# (record, columns) -> where each field is among the columns (None: in place)
_POSITIONS: dict[tuple[type[Any], tuple[str, ...]], tuple[int, ...] | None] = {}


def _positions(cls: type[Any], columns: tuple[str, ...]) -> tuple[int, ...] | None:
    """Where each field of `cls` is among `columns`; None when they are the same names in
    the same order (the row is passed as it is). Worked out once per record and columns."""
    try:
        return _POSITIONS[cls, columns]
    except KeyError:
        pass
    fields = field_names(cls)
    at: tuple[int, ...] | None = None
    missing = [f for f in fields if f not in columns]
    if missing:
        raise LookupError(
            f"{cls.__name__} needs the column(s) {', '.join(missing)}, which the statement "
            f"does not return (it returns {', '.join(columns) or 'no column'})"
        )
    if fields != columns:
        at = tuple(columns.index(f) for f in fields)
    _POSITIONS[cls, columns] = at
    return at


def build(cls: type[R], columns: Sequence[str], row: Sequence[Any]) -> R:
    """A `cls` from one row whose columns are named `columns`."""
    at = _positions(cls, tuple(columns))
    if at is None:
        return cls(*row)
    return cls(*[row[i] for i in at])


def column(columns: Sequence[str], row: Sequence[Any], name: str) -> Any:
    """The value of column `name` in a row whose columns are named `columns`."""
    try:
        return row[list(columns).index(name)]
    except ValueError:
        raise LookupError(
            f"the statement returns no column {name} (it returns {', '.join(columns)})"
        ) from None

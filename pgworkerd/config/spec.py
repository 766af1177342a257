"""How a key and a table are declared: a dataclass field carries its key's check and help
(`key(...)`), a `Table` names its dataclass, its place in the file and its help. The
loader (load.py), `check-config` (show.py) and the generated example and reference
(docs.py) all read these declarations, so a key is written once."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgworkerd.config.checks import Check


class ConfigError(ValueError):
    """An invalid configuration; the message names the file, key and line."""


_SPEC = "pgworkerd.key"  # the metadata entry of a field that is a key


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # no example given


@dataclass(frozen=True)
class Key:
    """One key of a table, as declared beside its field.

    check:   converts and checks the value (its bounds included) and says what it allows
    help:    what it does and why one would change it (the example's comment, the reference)
    example: a value shown commented out in the example, in place of the default (for a
             key that is unset by default, or whose default says nothing about its form)
    shown:   what check-config shows of a value (masks a secret); None: the value itself
    default_is_unset: the default stands for "not set" (a schedule's cron, resolved
             queue): the file cannot write it
    """

    name: str
    default: Any
    required: bool
    check: Check[Any]
    help: str
    example: Any = UNSET
    shown: Callable[[Any], Any] | None = None
    default_is_unset: bool = False

    def written(self, value: Any) -> Any:
        """`value` as the file holds it (durations as "30s", sizes as "1MiB", None as the
        check's word for it, such as "off"); None: the file cannot say it (unset)."""
        if self.default_is_unset and value == self.default:
            return None
        return self.check.unset if value is None else self.check.written(value)


def key(
    default: Any = dataclasses.MISSING,
    *,
    check: Check[Any],
    help: str,
    example: Any = UNSET,
    factory: Callable[[], Any] | None = None,
    shown: Callable[[Any], Any] | None = None,
    unset: bool = False,
) -> Any:
    """Declare a dataclass field as a key: `slots: int = key(4, check=..., help=...)`.
    No default (and no factory): the key is required. `unset`: the default stands for
    "not set" and is not a value the file could hold."""
    # name, default and required come from the field itself (keys_of)
    metadata = {_SPEC: Key("", None, False, check, help, example, shown, unset)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@functools.cache
def keys_of(cls: type) -> tuple[Key, ...]:
    """The keys a table dataclass declares, in field order (fields without key metadata,
    such as a handler's name, are not keys)."""
    found = []
    for f in dataclasses.fields(cls):
        if _SPEC not in f.metadata:
            continue
        if f.default is not dataclasses.MISSING:
            default, required = f.default, False
        elif f.default_factory is not dataclasses.MISSING:
            default, required = f.default_factory(), False
        else:
            default, required = None, True
        declared = f.metadata[_SPEC]
        found.append(dataclasses.replace(declared, name=f.name, default=default, required=required))
    return tuple(found)


@dataclass(frozen=True)
class Table:
    """A table of the file: `[name]`, or `[name.NAME]` tables when `named` (handlers,
    schedules: one per NAME, NAME checked like a handler name).

    help:     the table's introduction
    example:  for named tables, the NAME of the example table the example file shows
    commented: the example file shows the example table commented out
    extra:    TOML text the example file adds after the table (more named tables)
    """

    name: str
    cls: type
    help: str
    named: bool = False
    example: str = ""
    commented: bool = False
    extra: str = ""

    def declared(self) -> tuple[Key, ...]:
        return keys_of(self.cls)

    def key_names(self) -> list[str]:
        return [k.name for k in self.declared()]

"""Stdlib dataclasses as job payloads: JSON in (`load`), JSON out (`dump`) and their JSON
Schema (`schema`), for the types a JSON value can carry. Dependency-free: the job child
loads it. Pydantic models go through Pydantic itself (pgworkerd.typed).

Supported field types: str, int, float, bool, None, Any, Literal, Enum (of str or int
values), datetime, date and UUID (as ISO 8601 / canonical text), list[T], tuple[T, ...],
tuple[A, B], dict[str, T], unions (X | None) and nested dataclasses, including recursive
ones (`children: list["Node"]`). Anything else (set, bytes, a plain class) is refused when
the handler is declared (`check`): there is no JSON for it.

Strict where JSON is ambiguous: a bool is not an int, an int field takes 3 and 3.0 but not
"3", unknown keys are refused (the schema says additionalProperties: false), so a renamed
field is found by the first job that still carries the old name. Messages name the field
(`items[2].width`) and the JSON type found, never the value: a payload may hold secrets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import math
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# A field path names at most this much of a key a payload made up (hostile: huge keys).
_KEY_SHOWN = 64


class PayloadError(ValueError):
    """A payload that does not fit its type: `path` (e.g. "items[2].width", "" for the
    payload itself) and `problem`, without the offending value."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)

    def within(self, step: str) -> PayloadError:
        """The same problem seen from one level up: `step` is a field name or an index
        ("[2]", "['key']") leading to where it was found."""
        if not self.path:
            return PayloadError(step, self.problem)
        joint = "" if self.path.startswith("[") else "."
        return PayloadError(f"{step}{joint}{self.path}", self.problem)


def json_kind(value: Any) -> str:
    """The JSON type of a loaded value, as messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _key(key: str) -> str:
    shown = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "…"
    return repr(shown)


def _field(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field types of dataclass `cls`; TypeError naming what cannot be
    resolved (a forward reference to an unknown name)."""
    try:
        return typing.get_type_hints(cls)
    except RecursionError:
        raise
    except Exception as exc:  # NameError, or whatever evaluating user annotations raises
        raise TypeError(
            f"cannot resolve the field types of {cls.__qualname__}: {type(exc).__name__}: {exc}"
        ) from None


@functools.cache  # per class, once: resolving annotations is slow
def _fields(cls: type) -> list[tuple[str, Any, bool]]:
    """(name, type, required) of each field the constructor takes."""
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, hints.get(f.name, Any), required))
    return out


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def check(tp: Any, where: str = "", seen: set[type] | None = None) -> None:
    """Raise TypeError if type `tp` (a dataclass, or a field's type) has no JSON form,
    naming the field."""
    seen = set() if seen is None else seen
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    name = where or getattr(tp, "__qualname__", repr(tp))
    if tp is Any or tp in (str, int, float, bool, type(None), None, datetime, date, uuid.UUID):
        return
    if origin is typing.Literal:
        for arg in args:
            if arg is not None and not isinstance(arg, str | int | bool):
                raise TypeError(f"{name}: Literal values must be str, int, bool or None")
        return
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if isinstance(member.value, bool) or not isinstance(member.value, str | int):
                raise TypeError(f"{name}: enum {tp.__qualname__} values must be str or int")
        return
    if _is_union(tp):
        for arg in args:
            check(arg, where, seen)
        return
    if origin is list and len(args) == 1:
        check(args[0], f"{where}[]", seen)
        return
    if origin is tuple and args:
        for arg in args if args[-1] is not Ellipsis else args[:1]:
            check(arg, f"{where}[]", seen)
        return
    if origin is dict and len(args) == 2:
        if args[0] is not str:
            raise TypeError(f"{name}: dict keys must be str (JSON object keys are text)")
        check(args[1], f"{where}[]", seen)
        return
    if _is_dataclass_type(tp):
        if tp in seen:  # recursive: checked once
            return
        seen.add(tp)
        for field_name, field_type, _required in _fields(tp):
            check(field_type, _field(where, field_name) if where else field_name, seen)
        return
    raise TypeError(
        f"{name}: type {getattr(tp, '__qualname__', tp)!r} cannot be a JSON value "
        "(use str, int, float, bool, None, Any, Literal, an Enum, datetime, date, UUID, "
        "list[T], tuple, dict[str, T], a union or a dataclass)"
    )


def load(tp: Any, value: Any, path: str = "") -> Any:
    """The value of type `tp` that JSON `value` holds; PayloadError if it does not fit."""
    try:
        return _loader(tp)(value)
    except PayloadError as exc:
        raise exc.within(path) if path else exc from None


Loader = Callable[[Any], Any]


def warm(tp: Any) -> None:
    """Build the loaders of `tp` and of every dataclass it reaches, ahead of a first load
    (pgworkerd.typed.prime: in the fork server, inherited by every child)."""
    _loader(tp)
    seen: set[type] = set()
    todo = [tp]
    while todo:
        current = todo.pop()
        if _is_dataclass_type(current):
            if current in seen:  # (a recursive type reaches itself)
                continue
            seen.add(current)
            with contextlib.suppress(PayloadError):  # (refused: it is not a payload)
                _loader(current)(_NOT_A_PAYLOAD)  # makes its fields' loaders on the way
            todo.extend(t for _n, t, _r in _fields(current))
        else:
            todo.extend(typing.get_args(current))


_NOT_A_PAYLOAD = object()


@functools.cache  # one loader per type, made once: the child runs it for every job
def _loader(tp: Any) -> Loader:
    """A function from JSON to a value of `tp`, raising PayloadError with the path below
    it (containers add their step only when an error passes through: no path is built
    for a payload that fits)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return lambda value: value
    if tp is None or tp is type(None):
        return _expect(lambda v: v is None, "null")
    if tp is bool:
        return _expect(lambda v: isinstance(v, bool), "a boolean")
    if tp is int:
        return _load_int
    if tp is float:
        return _load_float
    if tp is str:
        return _expect(lambda v: isinstance(v, str), "a string")
    if tp in (datetime, date, uuid.UUID):
        return functools.partial(_load_text_type, tp)
    if origin is typing.Literal:
        return functools.partial(_load_choice, args, list(args))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = tuple((m.value, m) for m in tp)
        return functools.partial(_load_enum, members, [v for v, _ in members])
    if _is_union(tp):
        return _union_loader(args)
    if origin is list or (origin is tuple and args and args[-1] is Ellipsis):
        return functools.partial(_load_array, _loader(args[0]), origin is tuple)
    if origin is tuple:
        return functools.partial(_load_fixed, tuple(_loader(a) for a in args))
    if origin is dict:
        return functools.partial(_load_object, _loader(args[1]))
    if _is_dataclass_type(tp):
        return _dataclass_loader(tp)
    raise TypeError(f"type {tp!r} cannot be loaded from JSON")


def _expect(test: Callable[[Any], bool], what: str) -> Loader:
    def load_scalar(value: Any) -> Any:
        if not test(value):
            raise PayloadError("", f"expected {what}, not {json_kind(value)}")
        return value

    return load_scalar


def _load_int(value: Any) -> int:
    if type(value) is int:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError("", f"expected an integer, not {json_kind(value)}")
    return int(value)


def _load_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PayloadError("", f"expected a number, not {json_kind(value)}")
    return float(value)


def _load_text_type(tp: Any, value: Any) -> Any:
    if not isinstance(value, str):
        raise PayloadError("", f"expected a {tp.__name__} as a string, not {json_kind(value)}")
    try:
        return uuid.UUID(value) if tp is uuid.UUID else tp.fromisoformat(value)
    except ValueError:
        raise PayloadError("", f"not a valid {tp.__name__}") from None


def _load_choice(choices: tuple[Any, ...], shown: list[Any], value: Any) -> Any:
    for choice in choices:  # (True == 1 in Python: compare types too)
        if value == choice and type(value) is type(choice):
            return choice
    raise PayloadError("", f"expected one of {shown!r}")


def _load_enum(members: tuple[tuple[Any, Any], ...], shown: list[Any], value: Any) -> Any:
    for member_value, member in members:
        if value == member_value and type(value) is type(member_value):
            return member
    raise PayloadError("", f"expected one of {shown!r}")


def _union_loader(args: tuple[Any, ...]) -> Loader:
    loaders = tuple(_loader(a) for a in args)
    # X | None holding a value: X's own message, with its path
    some = tuple(_loader(a) for a in args if a is not None and a is not type(None))

    def load_union(value: Any) -> Any:
        if value is not None and len(some) == 1:
            return some[0](value)
        problems = []
        for load_one in loaders:
            try:
                return load_one(value)
            except PayloadError as exc:
                problems.append(exc.problem)
        raise PayloadError("", "matches no type of the union: " + "; ".join(problems))

    return load_union


def _load_array(item: Loader, as_tuple: bool, value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise PayloadError("", f"expected an array, not {json_kind(value)}")
    out = []
    for n, v in enumerate(value):
        try:
            out.append(item(v))
        except PayloadError as exc:
            raise exc.within(f"[{n}]") from None
    return tuple(out) if as_tuple else out


def _load_fixed(items: tuple[Loader, ...], value: Any) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise PayloadError("", f"expected an array, not {json_kind(value)}")
    if len(value) != len(items):
        raise PayloadError("", f"expected {len(items)} items, not {len(value)}")
    out = []
    for n, (item, v) in enumerate(zip(items, value, strict=True)):
        try:
            out.append(item(v))
        except PayloadError as exc:
            raise exc.within(f"[{n}]") from None
    return tuple(out)


def _load_object(item: Loader, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise PayloadError("", f"expected an object, not {json_kind(value)}")
    out = {}
    for k, v in value.items():
        try:
            out[k] = item(v)
        except PayloadError as exc:
            raise exc.within(f"[{_key(k)}]") from None
    return out


def _dataclass_loader(cls: type) -> Loader:
    # The fields' loaders are made on first use, not here: a recursive dataclass
    # (`children: list[Node]`) would otherwise ask for its own loader while making it.
    fields: list[tuple[str, Loader, bool]] = []
    known: set[str] = set()
    name = cls.__qualname__

    def load_dataclass(value: Any) -> Any:
        if not fields:
            fields.extend((n, _loader(t), required) for n, t, required in _fields(cls))
            known.update(n for n, _t, _r in fields)
        if not isinstance(value, Mapping):
            raise PayloadError("", f"expected an object ({name}), not {json_kind(value)}")
        for key in value:
            if key not in known:
                shown = key if isinstance(key, str) else str(key)
                raise PayloadError(_key(shown), f"unknown field of {name}")
        kwargs = {}
        for field_name, load_field, required in fields:
            if field_name in value:
                try:
                    kwargs[field_name] = load_field(value[field_name])
                except PayloadError as exc:
                    raise exc.within(field_name) from None
            elif required:
                raise PayloadError(field_name, "missing (a required field)")
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:  # its __post_init__ refused the values
            raise PayloadError("", f"{name} refused it: {exc}") from None

    return load_dataclass


def dump(tp: Any, value: Any, path: str = "") -> Any:
    """JSON form of `value`, which must be of type `tp`; PayloadError if it is not (a
    dataclass does not check its fields' types when constructed: this does)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise PayloadError(path, "expected a finite number (JSON has no NaN or infinity)")
        return float(value)
    if tp in (datetime, date, uuid.UUID):
        if not isinstance(value, tp) or (tp is date and isinstance(value, datetime)):
            raise PayloadError(path, f"expected a {tp.__name__}, not {type(value).__name__}")
        return str(value) if tp is uuid.UUID else value.isoformat()
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if not isinstance(value, tp):
            raise PayloadError(path, f"expected a {tp.__qualname__}, not {type(value).__name__}")
        return value.value
    if _is_union(tp):
        for arg in args:
            try:
                return dump(arg, value, path)
            except PayloadError:
                continue
        raise PayloadError(path, f"{type(value).__name__} matches no type of the union")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise PayloadError(path, f"expected a list or tuple, not {type(value).__name__}")
        if origin is tuple and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise PayloadError(path, f"expected {len(args)} items, not {len(value)}")
            pairs = enumerate(zip(args, value, strict=True))
            return [dump(a, v, f"{path}[{n}]") for n, (a, v) in pairs]
        return [dump(args[0], v, f"{path}[{n}]") for n, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise PayloadError(path, f"expected a dict, not {type(value).__name__}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise PayloadError(path, f"keys must be strings, not {type(k).__name__}")
            out[k] = dump(args[1], v, f"{path}[{_key(k)}]")
        return out
    if _is_dataclass_type(tp):
        if not isinstance(value, tp):
            raise PayloadError(path, f"expected a {tp.__qualname__}, not {type(value).__name__}")
        return {
            name: dump(field_type, getattr(value, name), _field(path, name))
            for name, field_type, _required in _fields(tp)
        }
    # the scalars and Literal: a JSON value already, checked as on the way in
    return load(tp, value, path)


def schema(tp: type) -> dict[str, Any]:
    """The JSON Schema (2020-12) of dataclass `tp`: each dataclass in $defs, referenced."""
    defs: dict[str, Any] = {}
    names: dict[type, str] = {}
    root = _schema(tp, defs, names)
    out: dict[str, Any] = {"$schema": SCHEMA_DIALECT, "title": tp.__qualname__}
    out.update(root)
    out["$defs"] = defs
    return out


def _schema(tp: Any, defs: dict[str, Any], names: dict[type, str]) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if tp is Any:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp in simple:
        return {"type": simple[tp]}
    if tp in (datetime, date, uuid.UUID):
        fmt = {datetime: "date-time", date: "date", uuid.UUID: "uuid"}[tp]
        return {"type": "string", "format": fmt}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"title": tp.__qualname__, "enum": [m.value for m in tp]}
    if _is_union(tp):
        return {"anyOf": [_schema(a, defs, names) for a in args]}
    if origin is list or (origin is tuple and args and args[-1] is Ellipsis):
        return {"type": "array", "items": _schema(args[0], defs, names)}
    if origin is tuple:
        return {
            "type": "array",
            "prefixItems": [_schema(a, defs, names) for a in args],
            "items": False,
            "minItems": len(args),
        }
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], defs, names)}
    if _is_dataclass_type(tp):
        if tp not in names:
            name = tp.__qualname__
            while name in defs:  # same name, another module
                name += "_"
            names[tp] = name
            defs[name] = {}  # reserved before the fields: a recursive field refers to it
            fields = _fields(tp)
            defs[name] = {
                "title": tp.__qualname__,
                "type": "object",
                "properties": {n: _schema(t, defs, names) for n, t, _r in fields},
                "required": [n for n, _t, required in fields if required],
                "additionalProperties": False,
            }
        return {"$ref": f"#/$defs/{names[tp]}"}
    raise TypeError(f"type {tp!r} has no JSON Schema")

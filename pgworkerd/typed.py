"""Typed payloads: a handler declares its payload's type by annotating its second
parameter with a dataclass or a Pydantic (v2) model:

    def resize(job: JobContext, request: ResizeRequest) -> dict: ...

The job child validates the job's payload against that type before the handler runs and
passes the value (`bind`); a payload that no longer validates ends the job dead at once
(pgworkerd.GiveUp: the attempt is recorded, no retry: a retry would read the same
payload), the reason naming the field. `enqueue_typed` / `JobSpec.typed` validate when a
job is enqueued (pgworkerd.client), and `pgworkerd payload-schema` exports each
handler's JSON Schema.

Why the annotation and not a decorator: the handler stays a plain function (the config's
`target` names it as before, tests call it directly, tracebacks show no wrapper), the type
is where a reader and mypy look for it, and nothing needs registering at import time.
The daemon checks the declaration when it imports its handlers (`run`, `check-config`):
a type with no JSON form is a config error there, not a dead job later.

The handler's name, which the function cannot know (the config names it), is the
function's __name__ unless `handler=` says otherwise.

Pydantic is optional (the `pydantic` extra): a model exists only once pydantic is
imported, so it is looked up in sys.modules, never imported here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, is_dataclass
from typing import Any

from pgworkerd import typedjson
from pgworkerd.typedjson import PayloadError
from pgworkerd.worker.outcomes import GiveUp

__all__ = [
    "PayloadError",
    "PayloadInvalid",
    "PayloadType",
    "TypedHandler",
    "bind",
    "check_declaration",
    "handler_name",
    "payload_json",
    "prime",
    "schema",
    "typed_handler",
]


class PayloadType:
    """How one payload type goes to and from JSON, and its JSON Schema."""

    def __init__(self, tp: type) -> None:
        self.type = tp
        self.name = tp.__qualname__

    def load(self, data: Any) -> Any:
        """The typed value of JSON `data`; PayloadError naming the field if it does not fit."""
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        """The JSON form of a value of this type; PayloadError if it is not one."""
        raise NotImplementedError

    def json_schema(self) -> dict[str, Any]:
        """Its JSON Schema (2020-12); TypeError if it has none (no JSON form)."""
        raise NotImplementedError

    def warm(self) -> None:
        """Make now what its first load would make (prime)."""


class DataclassPayload(PayloadType):
    def __init__(self, tp: type) -> None:
        super().__init__(tp)
        typedjson.check(tp)  # TypeError naming a field with no JSON form

    def load(self, data: Any) -> Any:
        return typedjson.load(self.type, data)

    def dump(self, value: Any) -> Any:
        return typedjson.dump(self.type, value)

    def json_schema(self) -> dict[str, Any]:
        return typedjson.schema(self.type)

    def warm(self) -> None:
        typedjson.warm(self.type)


class PydanticPayload(PayloadType):
    """A Pydantic model (or Pydantic dataclass), with its own validation (lax or strict,
    extra fields as the model configures) and its own schema. A model's own methods, not
    a TypeAdapter: building one costs ~20 ms in a fresh child (pydantic's lazy imports)."""

    def __init__(self, tp: type, pydantic: Any) -> None:
        super().__init__(tp)
        self._pydantic = pydantic
        self._is_model = issubclass(tp, pydantic.BaseModel)
        self._adapter: Any = None if self._is_model else pydantic.TypeAdapter(tp)

    def _error(self, exc: Any) -> PayloadError:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0] if errors else {"loc": (), "msg": str(exc)}
        path = ""
        for part in first.get("loc", ()):
            path = f"{path}[{part}]" if isinstance(part, int) else typedjson._field(path, part)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return PayloadError(path, f"{first.get('msg', 'invalid')}{more}")

    def load(self, data: Any) -> Any:
        try:
            if self._is_model:
                return self.type.model_validate(data)  # type: ignore[attr-defined]
            return self._adapter.validate_python(data)
        except self._pydantic.ValidationError as exc:
            raise self._error(exc) from None

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.type):
            raise PayloadError("", f"expected a {self.name}, not {type(value).__name__}")
        try:
            if self._is_model:
                return value.model_dump(mode="json")  # type: ignore[attr-defined]
            return self._adapter.dump_python(value, mode="json")
        except self._pydantic.ValidationError as exc:
            raise self._error(exc) from None
        except Exception as exc:  # PydanticSerializationError: a field with no JSON form
            raise PayloadError("", f"cannot be written as JSON: {exc}") from None

    def json_schema(self) -> dict[str, Any]:
        try:
            if self._is_model:
                schema: dict[str, Any] = self.type.model_json_schema()  # type: ignore[attr-defined]
            else:
                schema = self._adapter.json_schema()
        except Exception as exc:  # PydanticInvalidForJsonSchema and kin: no JSON form
            raise TypeError(
                f"{self.name} cannot be a JSON payload: {type(exc).__name__}: {exc}"
            ) from None
        return {"$schema": typedjson.SCHEMA_DIALECT, **schema}


def payload_type(tp: Any) -> PayloadType | None:
    """The PayloadType of annotation `tp`, None if it is neither a dataclass nor a Pydantic
    model; TypeError if it is one that cannot be a JSON payload."""
    if not isinstance(tp, type):
        return None
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and (
        issubclass(tp, pydantic.BaseModel) or pydantic.dataclasses.is_pydantic_dataclass(tp)
    ):
        return PydanticPayload(tp, pydantic)
    if is_dataclass(tp):
        return DataclassPayload(tp)
    return None


@dataclass(frozen=True)
class TypedHandler:
    """A handler with a typed payload: the parameter that takes it, and its type."""

    parameter: str
    payload: PayloadType


# handler function -> its declaration (None: untyped), worked out once per process: the
# child asks for every job.
_DECLARED: dict[Any, TypedHandler | None] = {}


def typed_handler(func: Callable[..., Any]) -> TypedHandler | None:
    """The typed payload `func` declares, None for a plain `def handler(job)`. TypeError,
    saying why, for a second parameter that cannot take a payload."""
    try:
        return _DECLARED[func]
    except (KeyError, TypeError):  # (TypeError: an unhashable callable)
        pass
    declared = _declaration(func)
    with contextlib.suppress(TypeError):
        _DECLARED[func] = declared
    return declared


def _declaration(func: Callable[..., Any]) -> TypedHandler | None:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: plain
        return None
    if len(params) < 2:
        return None
    second = params[1]
    if second.kind in (second.VAR_POSITIONAL, second.VAR_KEYWORD):
        return None
    what = f"handler {getattr(func, '__qualname__', func)!r} parameter {second.name!r}"
    annotation = second.annotation
    if annotation is second.empty:
        if second.default is not second.empty:
            return None  # optional and untyped: called as handler(job), as ever
        raise TypeError(
            f"{what}: a handler's second parameter takes its typed payload: annotate it with "
            "a dataclass or a Pydantic model (or read the plain payload as job.payload)"
        )
    if isinstance(annotation, str):  # `from __future__ import annotations`: resolved here
        try:
            module = sys.modules.get(getattr(func, "__module__", "") or "")
            namespace = dict(vars(module)) if module is not None else {}
            namespace.update(getattr(func, "__globals__", {}))
            annotation = eval(annotation, namespace)  # the handler module's own text
        except Exception as exc:
            raise TypeError(
                f"{what}: cannot resolve its annotation {second.annotation!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
    try:
        payload = payload_type(annotation)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None
    if payload is None:
        if second.default is not second.empty:
            return None
        raise TypeError(
            f"{what}: annotated {annotation!r}, which is neither a dataclass nor a Pydantic "
            "model: a handler's second parameter takes its typed payload (the plain payload "
            "is job.payload)"
        )
    if second.kind is second.POSITIONAL_ONLY:
        raise TypeError(f"{what}: the payload parameter must not be positional-only")
    return TypedHandler(second.name, payload)


def prime(module: Any) -> int:
    """Work out ahead the declarations of the functions `module` defines, and build their
    payloads' loaders: the fork server does it once, after preloading the handler modules,
    so that every child it forks inherits them instead of paying for them on its first
    job (a few ms: annotations resolved, types walked). Returns how many are typed; a
    function that is no handler, or a bad declaration, is left for the child to find."""
    typed = 0
    for value in list(vars(module).values()):
        if not inspect.isfunction(value) or value.__module__ != module.__name__:
            continue
        try:
            declared = typed_handler(value)
            if declared is not None:
                declared.payload.warm()
                typed += 1
        except Exception:  # not a handler, or one the daemon's check reports
            continue
    return typed


def check_declaration(func: Callable[..., Any]) -> None:
    """TypeError, saying why, if `func` declares a payload type that cannot be a JSON
    payload: what the daemon asks of each handler when it imports them (`run`,
    `check-config`), so that the mistake stops it there rather than failing every job."""
    declared = typed_handler(func)
    if declared is not None:
        try:
            declared.payload.json_schema()
        except TypeError as exc:
            raise TypeError(f"handler {getattr(func, '__qualname__', func)!r}: {exc}") from None


class PayloadInvalid(GiveUp):
    """A job's payload does not validate as its handler's payload type: the job ends
    dead at once (a retry would read the same payload)."""


def bind(func: Callable[..., Any], payload: Any) -> Callable[..., Any]:
    """`func` ready to be called with the job's context alone: a typed handler gets its
    payload validated and passed (PayloadInvalid if it does not validate); any other
    handler is returned as it is. (A partial keeps an `async def` handler recognisable.)"""
    declared = typed_handler(func)
    if declared is None:
        return func
    name = declared.payload.name
    try:
        value = declared.payload.load(payload)
    except PayloadError as exc:
        raise PayloadInvalid(f"payload does not validate as {name} (not retried): {exc}") from None
    except RecursionError:
        raise PayloadInvalid(f"payload nests too deeply to load as {name} (not retried)") from None
    return functools.partial(func, **{declared.parameter: value})


def payload_json(func: Callable[..., Any], payload: Any) -> dict[str, Any]:
    """The JSON payload of a job of typed handler `func`: `payload` (a value of its type,
    or a mapping) validated and written out as the handler will read it back. Raises
    ValueError saying why (the client turns it into InvalidJob)."""
    try:
        declared = typed_handler(func)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if declared is None:
        raise ValueError(
            f"handler {getattr(func, '__qualname__', func)!r} declares no typed payload "
            "(its second parameter, annotated with a dataclass or a Pydantic model): "
            "use pgworkerd.enqueue"
        )
    kind = declared.payload
    try:
        value = kind.load(payload) if isinstance(payload, Mapping) else payload
        data = kind.dump(value)
        kind.load(data)  # what the child will do: a value that cannot come back is refused
    except PayloadError as exc:
        raise ValueError(f"payload does not validate as {kind.name}: {exc}") from None
    except RecursionError:
        raise ValueError(
            f"payload of {kind.name} refers to itself or nests too deeply to be JSON"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"payload of {kind.name} must be a JSON object, not {type(data).__name__}")
    return data


def handler_name(func: Callable[..., Any], handler: str | None) -> str:
    """The name a job of `func` is enqueued under: `handler`, default func's __name__."""
    return handler if handler is not None else getattr(func, "__name__", "")


def schema(func: Callable[..., Any]) -> dict[str, Any] | None:
    """The JSON Schema (2020-12) of typed handler `func`'s payload, None if it has none."""
    declared = typed_handler(func)
    return None if declared is None else declared.payload.json_schema()

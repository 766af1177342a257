"""Typed payloads without a database (pgworkerd.typed, pgworkerd.typedjson): which handlers
declare a payload type and which declarations are refused; dataclass payloads to and from
JSON, with messages that name the field but never quote the value; the exported JSON
Schema judged by an independent validator (jsonschema) against the same payloads."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Literal

import jsonschema
import pydantic
import pytest

from pgworkerd import typed, typedjson
from pgworkerd.typedjson import PayloadError
from pgworkerd.worker.outcomes import GiveUp


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Point:
    x: int
    y: float = 0.0


@dataclass
class Shape:
    name: str
    points: list[Point]
    colour: Colour = Colour.RED
    kind: Literal["open", "closed"] = "closed"
    labels: dict[str, str] = field(default_factory=dict)
    pair: tuple[int, str] | None = None
    drawn: datetime | None = None
    day: date | None = None
    ref: uuid.UUID | None = None
    extra: Any = None
    parent: Shape | None = None


GOOD: dict[str, Any] = {
    "name": "tri",
    "points": [{"x": 1, "y": 2.5}, {"x": 3.0}],  # 3.0 is an integer in JSON Schema too
    "colour": "blue",
    "kind": "open",
    "labels": {"a": "b"},
    "pair": [1, "one"],
    "drawn": "2026-01-02T03:04:05+00:00",
    "day": "2026-01-02",
    "ref": "12345678-1234-5678-1234-567812345678",
    "extra": {"anything": [1, None]},
    "parent": {"name": "p", "points": []},
}

BAD: list[tuple[dict[str, Any], str]] = [
    ({"points": []}, "name: missing (a required field)"),
    ({"name": "s", "points": [{"x": "1"}]}, "points[0].x: expected an integer, not string"),
    ({"name": "s", "points": [{"x": True}]}, "points[0].x: expected an integer, not boolean"),
    ({"name": "s", "points": [{"x": 1.5}]}, "points[0].x: expected an integer, not number"),
    ({"name": "s", "points": {}}, "points: expected an array, not object"),
    ({"name": "s", "points": [], "colour": "green"}, "colour: expected one of ['red', 'blue']"),
    ({"name": "s", "points": [], "kind": "half"}, "kind: expected one of ['open', 'closed']"),
    ({"name": "s", "points": [], "labels": {"k": 1}}, "labels['k']: expected a string"),
    ({"name": "s", "points": [], "pair": [1]}, "pair: expected 2 items, not 1"),
    ({"name": "s", "points": [], "nme": 1}, "'nme': unknown field of Shape"),
    ({"name": "s", "points": [], "parent": {"name": 2, "points": []}}, "parent.name:"),
    ({"name": "s", "points": [], "drawn": "yesterday"}, "drawn: not a valid datetime"),
]


def test_a_dataclass_payload_loads_dumps_and_round_trips() -> None:
    shape = typedjson.load(Shape, GOOD)
    assert shape.points == [Point(1, 2.5), Point(3, 0.0)]
    assert isinstance(shape.points[1].x, int)
    assert shape.colour is Colour.BLUE and shape.pair == (1, "one")
    assert shape.drawn == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert shape.day == date(2026, 1, 2) and isinstance(shape.ref, uuid.UUID)
    assert isinstance(shape.parent, Shape) and shape.parent.points == []
    dumped = typedjson.dump(Shape, shape)
    assert typedjson.load(Shape, dumped) == shape
    assert dumped["colour"] == "blue" and dumped["pair"] == [1, "one"]


@pytest.mark.parametrize(("payload", "said"), BAD)
def test_a_payload_that_does_not_fit_names_the_field(payload: dict[str, Any], said: str) -> None:
    with pytest.raises(PayloadError) as refused:
        typedjson.load(Shape, payload)
    assert said in str(refused.value)


def test_messages_never_quote_the_value() -> None:
    secret = "sk_live_very_secret"
    for payload in (
        {"name": 1, "points": [], "labels": {"k": secret}},
        {"name": secret, "points": [{"x": secret}]},
        {"name": "s", "points": [], "colour": secret},
    ):
        with pytest.raises(PayloadError) as refused:
            typedjson.load(Shape, payload)
        assert secret not in str(refused.value)


def test_a_hostile_key_is_named_in_part() -> None:
    """A payload's own keys appear in messages (they are its structure, not its values),
    cut short: a 1 MB key makes a short message."""
    with pytest.raises(PayloadError) as refused:
        typedjson.load(Shape, {"name": "s", "points": [], "k" * 1_000_000: 1})
    assert len(str(refused.value)) < 200
    assert "unknown field of Shape" in str(refused.value)
    with pytest.raises(PayloadError) as refused:
        typedjson.load(Shape, {"name": "s", "points": [], "labels": {"k" * 1_000_000: 1}})
    assert len(str(refused.value)) < 200


def test_the_schema_agrees_with_the_loader() -> None:
    schema = typedjson.schema(Shape)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert validator.is_valid(GOOD)
    for payload, said in BAD:
        if said.startswith("drawn"):
            continue  # a format, which JSON Schema only annotates unless asked to check
        assert not validator.is_valid(payload), said
    assert schema["$defs"]["Shape"]["properties"]["parent"] == {
        "anyOf": [{"$ref": "#/$defs/Shape"}, {"type": "null"}]  # recursive: by reference
    }


def test_dump_checks_what_a_dataclass_does_not() -> None:
    with pytest.raises(PayloadError, match=r"points\[0\]\.x: expected an integer, not string"):
        typedjson.dump(Shape, Shape("s", [Point("1")]))  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match="finite number"):
        typedjson.dump(Point, Point(1, float("nan")))
    with pytest.raises(PayloadError, match="expected a Shape, not dict"):
        typedjson.dump(Shape, GOOD)


# -- Declarations --------------------------------------------------------------------------


class Model(pydantic.BaseModel):
    n: int


def plain(job: Any) -> None: ...


def typed_dc(job: Any, shape: Shape) -> None: ...


def typed_model(job: Any, *, model: Model) -> None: ...


async def typed_async(job: Any, shape: Shape) -> None: ...


def optional_extra(job: Any, verbose: bool = False) -> None: ...


def unannotated(job: Any, payload) -> None: ...


def dict_annotated(job: Any, payload: dict[str, Any]) -> None: ...


def positional_only(job: Any, shape: Shape, /) -> None: ...


def unknown_name(job: Any, shape: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
    ...


@dataclass
class WithBytes:
    data: bytes


def bytes_payload(job: Any, payload: WithBytes) -> None: ...


class Opaque:
    pass


class OpaqueModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    thing: Opaque


def opaque_model(job: Any, payload: OpaqueModel) -> None: ...


def test_which_handlers_declare_a_payload_type() -> None:
    assert typed.typed_handler(plain) is None
    assert typed.typed_handler(optional_extra) is None
    dc = typed.typed_handler(typed_dc)
    assert dc is not None and (dc.parameter, dc.payload.type) == ("shape", Shape)
    model = typed.typed_handler(typed_model)
    assert model is not None and (model.parameter, model.payload.type) == ("model", Model)


@pytest.mark.parametrize(
    ("handler", "said"),
    [
        (unannotated, "parameter 'payload': a handler's second parameter takes its typed"),
        (dict_annotated, "neither a dataclass nor a Pydantic model"),
        (positional_only, "must not be positional-only"),
        (unknown_name, "cannot resolve its annotation 'NoSuchType': NameError"),
        (bytes_payload, "data: type 'bytes' cannot be a JSON value"),
        (opaque_model, "OpaqueModel cannot be a JSON payload"),
    ],
)
def test_a_declaration_without_a_json_form_is_refused(handler: Any, said: str) -> None:
    with pytest.raises(TypeError, match=said.replace("(", r"\(").replace(")", r"\)")):
        typed.check_declaration(handler)


def test_bind_validates_passes_the_value_and_gives_up_on_a_bad_payload() -> None:
    assert typed.bind(plain, {"x": 1}) is plain
    bound = typed.bind(typed_model, {"n": "3"})  # Pydantic's own (lax) rules
    assert bound.keywords == {"model": Model(n=3)}  # type: ignore[attr-defined]
    # an async handler stays one once bound (the child awaits it)
    assert inspect.iscoroutinefunction(typed.bind(typed_async, {"name": "s", "points": []}))
    with pytest.raises(typed.PayloadInvalid) as refused:
        typed.bind(typed_dc, {"name": "s", "points": [{"y": 1}]})
    assert isinstance(refused.value, GiveUp)  # dead at once: no retry
    assert refused.value.reason == (
        "payload does not validate as Shape (not retried): points[0].x: missing (a required field)"
    )
    with pytest.raises(typed.PayloadInvalid, match="n: Input should be a valid integer"):
        typed.bind(typed_model, {"n": "three"})


def test_a_deep_payload_of_a_recursive_type_is_refused_not_a_crash() -> None:
    deep: dict[str, Any] = {"name": "leaf", "points": []}
    for _ in range(5000):
        deep = {"name": "n", "points": [], "parent": deep}
    with pytest.raises(typed.PayloadInvalid, match="nests too deeply"):
        typed.bind(typed_dc, deep)


def test_payload_json_takes_a_value_or_a_mapping() -> None:
    written = typed.payload_json(typed_dc, {"name": "s", "points": [{"x": 1}]})
    defaults = {"colour": "red", "kind": "closed", "labels": {}}  # written out, as Pydantic does
    nulls = {f.name: None for f in dataclasses.fields(Shape)}
    assert written == nulls | defaults | {"name": "s", "points": [{"x": 1, "y": 0.0}]}
    assert typed.payload_json(typed_model, Model(n=2)) == {"n": 2}
    with pytest.raises(ValueError, match="expected a Model, not Shape"):
        typed.payload_json(typed_model, Shape("s", []))


@pydantic.dataclasses.dataclass
class PydanticPoint:
    x: int


def pydantic_dc(job: Any, point: PydanticPoint) -> None: ...


def test_a_pydantic_dataclass_goes_through_pydantic() -> None:
    bound = typed.bind(pydantic_dc, {"x": "4"})  # Pydantic's lax rules, not the stdlib path
    assert bound.keywords == {"point": PydanticPoint(x=4)}  # type: ignore[attr-defined]
    assert typed.payload_json(pydantic_dc, PydanticPoint(x=5)) == {"x": 5}
    schema = typed.schema(pydantic_dc)
    assert schema is not None and schema["properties"]["x"]["type"] == "integer"
    with pytest.raises(typed.PayloadInvalid, match="x: Input should be a valid integer"):
        typed.bind(pydantic_dc, {"x": "four"})


def test_prime_works_out_a_modules_declarations_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the fork server does once, so that a fresh child's first job does not."""
    import sys
    import types

    module = types.ModuleType("primed")
    monkeypatch.setitem(sys.modules, "primed", module)
    exec(
        "from dataclasses import dataclass\n"
        "@dataclass\nclass P:\n    n: int\n    children: 'list[P]'\n"
        "def handler(job, p: P): ...\n"
        "def helper(a, b): ...\n"  # not a handler: left alone, no error
        "def plain(job): ...\n",
        vars(module),
    )
    assert typed.prime(module) == 1
    assert typed._DECLARED[module.handler] is not None
    assert module.helper not in typed._DECLARED
    bound = typed.bind(module.handler, {"n": 1, "children": []})
    assert bound.keywords == {"p": module.P(1, [])}  # type: ignore[attr-defined]

"""Handlers with typed payloads (pgworkerd.typed), for tests/integration/test_typed_payloads.py;
imported by the daemon's children through PYTHONPATH, with `from __future__ import
annotations` as most modules have it (the annotations are text until resolved)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import pydantic

from pgworkerd.worker import JobContext


class Format(enum.Enum):
    PNG = "png"
    JPEG = "jpeg"


@dataclass(frozen=True)
class Size:
    width: int
    height: int

    def __post_init__(self) -> None:
        if self.width <= 0 or self.height <= 0:
            raise ValueError("width and height must be positive")


@dataclass(frozen=True)
class ResizeRequest:
    path: str
    size: Size
    format: Format = Format.PNG
    tags: list[str] = field(default_factory=list)


def resize(job: JobContext, request: ResizeRequest) -> dict[str, Any]:
    """Says what it was handed: typed values, not dicts."""
    return {
        "request": type(request).__name__,
        "size": type(request.size).__name__,
        "area": request.size.width * request.size.height,
        "format": request.format.name,
        "tags": request.tags,
        "raw": job.payload,  # the JSON payload stays readable as before
    }


class Invoice(pydantic.BaseModel):
    customer: str
    amount_cents: int = pydantic.Field(gt=0)
    lines: list[str] = []


def bill(job: JobContext, invoice: Invoice) -> dict[str, Any]:
    return {"model": type(invoice).__name__, "amount": invoice.amount_cents}


async def bill_later(job: JobContext, invoice: Invoice) -> int:
    """An async typed handler: still recognised as async once its payload is bound."""
    return invoice.amount_cents


def plain(job: JobContext) -> dict[str, Any]:
    return job.payload


class Opaque:
    """A class with no JSON form."""


@dataclass
class HasSet:
    ids: set[int]


def bad_type(job: JobContext, payload: HasSet) -> None:
    """Declared with a payload type that cannot be JSON: refused when the daemon loads it."""


def untyped_second(job: JobContext, payload: dict[str, Any]) -> None:
    """A second parameter that is not a payload type: refused as well."""


@dataclass
class Node:
    """A recursive payload type: its schema refers to itself."""

    name: str
    children: list[Node] = field(default_factory=list)


def count_nodes(job: JobContext, tree: Node) -> int:
    return 1 + sum(count_nodes(job, child) for child in tree.children)

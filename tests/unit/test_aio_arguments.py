"""Unit tier: pgworkerd.aio.enqueue takes pgworkerd.client.enqueue's arguments, declared
once in client.enqueue: what help() and inspect show, and what a misspelt one gets."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from pgworkerd import aio, client


def test_the_async_enqueue_shows_the_sync_ones_arguments() -> None:
    sync = inspect.signature(client.enqueue)
    twin = inspect.signature(aio.enqueue)
    assert list(twin.parameters) == list(sync.parameters)
    assert [(p.kind, p.default, p.annotation) for p in list(twin.parameters.values())[1:]] == [
        (p.kind, p.default, p.annotation) for p in list(sync.parameters.values())[1:]
    ]
    assert twin.parameters["conn"].annotation == "psycopg.AsyncConnection[Any]"
    assert twin.return_annotation == sync.return_annotation == "int"
    assert inspect.iscoroutinefunction(aio.enqueue)
    assert "pgworkerd.client.enqueue" in (aio.enqueue.__doc__ or "")


def test_a_misspelt_argument_is_refused_by_name_before_any_round_trip() -> None:
    connection: Any = object()  # never used: the arguments are refused first
    with pytest.raises(TypeError, match="priorty"):
        asyncio.run(aio.enqueue(connection, "h", priorty=3))  # type: ignore[call-arg]

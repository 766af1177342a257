"""Unit tier: which values jsonb can store (checked in the child and in the parent)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgworkerd.jsontext import storable_json

REFUSED = {
    "NUL character": {"a": "x\x00y"},
    "lone surrogate": {"file": b"caf\xe9".decode("utf-8", "surrogateescape")},
    "NaN": {"n": float("nan")},
    "not JSON": {"s": {1, 2}},
}
STORED = {
    "emoji (a surrogate pair in JSON)": {"e": "\U0001f600"},
    "an escaped backslash before u0000": {"s": "\\u0000"},
    "plain": {"n": [1, 2.5, None, True, "text"]},
}


@pytest.mark.parametrize("value", REFUSED.values(), ids=list(REFUSED))
def test_refused(value: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        storable_json(value)


@pytest.mark.parametrize("value", STORED.values(), ids=list(STORED))
def test_stored_by_postgres_unchanged(value: Any, conn: psycopg.Connection) -> None:
    text = storable_json(value)
    assert json.loads(text) == value
    [(back,)] = conn.execute("SELECT %s::jsonb", (text,)).fetchall()
    assert back == value


@pytest.mark.parametrize("value", REFUSED.values(), ids=list(REFUSED))
def test_what_is_refused_postgres_refuses_too(value: Any, conn: psycopg.Connection) -> None:
    """The checks are no stricter than jsonb: what they refuse, jsonb refuses (or the value
    is not JSON at all)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return
    with pytest.raises(psycopg.Error):
        conn.execute("SELECT %s::jsonb", (text,))

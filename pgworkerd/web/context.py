"""What the dashboard's parts share: the settings, the pools and the login state, kept on
the Flask application (one Context per create_app) and found with `context()`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from flask import current_app
from psycopg_pool import ConnectionPool

from pgworkerd.web.auth import Devices, LoginThrottle, Sessions

# Password checks (scrypt: ~50 ms of CPU, 16 MiB) running at once at most; a login
# beyond that is answered 429 at once rather than holding a server thread in a queue.
# Logins that bring a device token for their name have checks of their own, so guessing
# without one cannot take them all.
VERIFY_AT_ONCE = 2
VERIFY_AT_ONCE_DEVICES = 2
# Where the Context sits in the application's `extensions`.
EXTENSION = "pgworkerd"


@dataclass(frozen=True)
class Settings:
    """What the application needs besides the pool (server.py builds it from the config)."""

    schema: str
    users: dict[str, str] = field(default_factory=dict)  # name -> password hash
    read_only: bool = False
    secure_cookie: bool = False
    # Host names the Host header may carry (None: any). A loopback-bound dashboard accepts
    # only loopback names, so a web page that rebinds its own DNS name to 127.0.0.1 cannot
    # read it (DNS rebinding).
    allowed_hosts: frozenset[str] | None = None
    dsn: str = ""  # only to mask its password in error messages
    action_dsn: str = ""  # the same, for [web] action_dsn
    idle_timeout: float = 30 * 60.0  # a session unused this long is over


@dataclass
class Context:
    """One dashboard's shared parts: pages read through `pool`; actions run through
    `action_pool` ([web] action_dsn, the operator's role) when given, else through `pool`."""

    settings: Settings
    pool: ConnectionPool
    action_pool: ConnectionPool | None = None
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    devices: Devices = field(default_factory=Devices)
    sessions: Sessions = field(init=False)
    verifying: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(VERIFY_AT_ONCE)
    )
    verifying_devices: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(VERIFY_AT_ONCE_DEVICES)
    )

    def __post_init__(self) -> None:
        self.sessions = Sessions(self.settings.idle_timeout)

    @property
    def login_needed(self) -> bool:
        return bool(self.settings.users)

    @property
    def stand_in(self) -> str:
        """What an unknown user name is checked against, so that it costs what a known
        one does (no timing tells which names exist): a configured hash, whose answer is
        then ignored (the name is unknown, so the login fails whatever the password)."""
        return next(iter(self.settings.users.values()), "")

    @contextmanager
    def database(self) -> Iterator[psycopg.Connection[Any]]:
        with self.pool.connection() as conn:
            yield conn

    @contextmanager
    def action_database(self) -> Iterator[psycopg.Connection[Any]]:
        with (self.action_pool or self.pool).connection() as conn:
            yield conn


def context() -> Context:
    """The Context of the application serving the current request."""
    found = current_app.extensions[EXTENSION]
    assert isinstance(found, Context)
    return found

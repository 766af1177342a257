"""Fixtures of the dashboard tests: a served dashboard on the test's schema and a fresh
headless Chromium (helpers: tests/support/dashboard_harness.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_harness import PASSWORD_HASH, USER, Http, RunningDashboard, chromium

from pgworkerd.config import WebConfig
from pgworkerd.web.server import build


@pytest.fixture
def start_dashboard(test_db_dsn: str, schema: str) -> Iterator[Callable[..., RunningDashboard]]:
    """start_dashboard(**web_settings) serves a dashboard on an ephemeral loopback port;
    [web.users] default to USER with PASSWORD."""
    started: list[RunningDashboard] = []

    def start(**settings: Any) -> RunningDashboard:
        settings.setdefault("users", {USER: PASSWORD_HASH})
        running = RunningDashboard(build(WebConfig(port=0, **settings), test_db_dsn, schema))
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            running.close()


@pytest.fixture
def dashboard(start_dashboard: Callable[..., RunningDashboard]) -> RunningDashboard:
    return start_dashboard()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A fresh headless Chromium with its own profile; quit at the end."""
    with chromium(tmp_path / "chromium-profile") as driver:
        yield driver


@pytest.fixture
def http_client(dashboard: RunningDashboard) -> Http:
    """A plain HTTP client logged in to `dashboard` as USER."""
    client = Http(dashboard.port)
    client.log_in()
    return client
